"""Decrypt one Caesar-shifted word: the user turn is the rotation and the cipher text
("2 jgnnq"), the answer the clear word ("hello"). Words are random letters generated in code.

Terse on purpose, so that a tiny model from `rlbus model init` learns it in minutes on CPU (see
../reverse_text/RESULTS.md for why a constant instruction in front of the input stalls such a
model). Unlike reversal, the answer depends on a second input (the rotation)."""

from __future__ import annotations

import random
import string

from rlbus.environment import TaskSet, reward
from rlbus.schemas import derived_id

LETTERS = string.ascii_lowercase


def shift(word: str, rotation: int) -> str:
    return "".join(LETTERS[(LETTERS.index(ch) + rotation) % 26] for ch in word)


class Caesar(TaskSet):
    name = "caesar"

    def __init__(
        self,
        n: int = 20_000,
        seed: int = 0,
        max_rotation: int = 3,
        min_len: int = 4,
        max_len: int = 7,
    ):
        super().__init__(
            n=n, seed=seed, max_rotation=max_rotation, min_len=min_len, max_len=max_len
        )

    def rows(self):
        a = self.args
        rng = random.Random(a["seed"])
        for i in range(a["n"]):
            word = "".join(
                rng.choice(LETTERS) for _ in range(rng.randint(a["min_len"], a["max_len"]))
            )
            rotation = rng.randint(1, a["max_rotation"])
            yield {
                "task_id": derived_id(self.name, a["seed"], i),
                "prompt": f"{rotation} {shift(word, rotation)}",
                "answer": word,
                "info": {"rotation": rotation, "length": len(word)},
            }

    @reward(weight=1.0)
    def exact(self, text: str, answer: str) -> float:
        return float(text.strip() == answer)

    @reward(weight=0.5)
    def letters_right(self, text: str, answer: str) -> float:
        """Share of the answer's letters in their place: credit for a near miss."""
        return sum(a == b for a, b in zip(text.strip(), answer, strict=False)) / max(
            len(answer), len(text.strip()), 1
        )
