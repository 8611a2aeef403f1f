"""Sums and differences of a few small numbers from reasoning-gym's `chain_sum` generator: a
verifiable answer, scored on the last number of the reply by the generator's own checker."""

from __future__ import annotations

import re

import reasoning_gym

from rlbus.environment import TaskSet, metric, reward
from rlbus.environment.task_sources.sources import reasoning_gym as reasoning_gym_rows

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> str | None:
    """The last number in the reply (a model that shows its working ends with the result)."""
    found = NUMBER.findall(text)
    return found[-1] if found else None


class ChainSum(TaskSet):
    name = "chain_sum"
    system_prompt = "Compute the result. Answer with the final number only."

    def __init__(
        self,
        size: int = 10_000,
        seed: int = 0,
        min_terms: int = 2,
        max_terms: int = 3,
        min_digits: int = 1,
        max_digits: int = 2,
    ):
        super().__init__(size=size, seed=seed)
        self.size, self.seed = size, seed
        self.difficulty = {
            "min_terms": min_terms,
            "max_terms": max_terms,
            "min_digits": min_digits,
            "max_digits": max_digits,
        }
        # The checker only needs the generator's class, not its data.
        self.checker = reasoning_gym.create_dataset("chain_sum", size=1, seed=seed)

    def rows(self):
        return reasoning_gym_rows("chain_sum", size=self.size, seed=self.seed, **self.difficulty)

    @reward(weight=1.0)
    def correct(self, text: str, answer: str) -> float:
        number = final_number(text)
        if number is None:
            return 0.0
        return float(self.checker.score_answer(answer=number, entry={"answer": answer}))

    @metric
    def answered(self, text: str) -> float:
        """1 when the reply holds a number at all."""
        return float(final_number(text) is not None)
