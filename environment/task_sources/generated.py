"""A built-in sample task set, generated in code (no download): reverse a short word."""

from __future__ import annotations

import random
from collections.abc import Iterator

from rlbus.schemas import TaskPublished, derived_id

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def reverse_text(
    n: int = 64, seed: int = 0, min_len: int = 5, max_len: int = 8, env: str = "reverse_text"
) -> Iterator[TaskPublished]:
    """`n` tasks "reverse this word"; the same seed gives the same tasks and ids."""
    rng = random.Random(seed)
    for i in range(n):
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(min_len, max_len)))
        yield TaskPublished(
            task_id=derived_id(env, seed, i),
            env=env,
            prompt=[{"role": "user", "content": f"Reverse the text: {word}"}],
            answer=word[::-1],
            info={"length": len(word)},
        )
