"""Arithmetic from reasoning-gym's offline generator, scored by the generator's own checker."""

from __future__ import annotations

import re

import reasoning_gym

from rlbus.environment import TaskSet, metric, reward
from rlbus.environment.task_sources.sources import reasoning_gym as reasoning_gym_rows

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class Arithmetic(TaskSet):
    name = "arithmetic"
    system_prompt = "Solve the problem. Put only the final number inside <answer></answer>."

    def __init__(self, dataset: str = "basic_arithmetic", size: int = 1000, seed: int = 0):
        super().__init__(dataset=dataset, size=size, seed=seed)
        self.dataset, self.size, self.seed = dataset, size, seed
        # The checker only needs the generator's class, not its data.
        self.checker = reasoning_gym.create_dataset(dataset, size=1, seed=seed)

    def rows(self):
        return reasoning_gym_rows(self.dataset, size=self.size, seed=self.seed)

    @staticmethod
    def extract(text: str) -> str:
        found = ANSWER.findall(text)
        return found[-1].strip() if found else text.strip()

    @reward(weight=1.0)
    def correct(self, text: str, task) -> float:
        entry = {
            "question": task.prompt,
            "answer": task.answer,
            "metadata": task.info.get("metadata", {}),
        }
        return float(self.checker.score_answer(answer=self.extract(text), entry=entry))

    @metric
    def formatted(self, text: str) -> float:
        return float(bool(ANSWER.search(text)))
