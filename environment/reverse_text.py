"""reverse_text, the built-in sample environment: reverse a short word (generated in code, no
download). Full credit for the exact reversal, partial credit by longest common subsequence,
and (as a group reward) a bonus for the most concise correct answer of a group.

`TerseReverseText` is the same task set with the bare word as the user turn: what a tiny model
from `rlbus model init` learns in minutes on a CPU (`rlbus quickstart`): with the instruction
and chat headers before the word, such a model's SFT loss hardly falls, with the word alone it
falls within a hundred steps (examples/reverse_text/RESULTS.md has the losses)."""

from __future__ import annotations

from typing import Any

from rlbus.environment.decorators import group_reward, metric, reward
from rlbus.environment.task_sources.generated import reverse_text
from rlbus.environment.taskset import TaskSet
from rlbus.schemas import Messages, TaskPublished


def lcs_ratio(a: str, b: str) -> float:
    """2 * |LCS(a, b)| / (|a| + |b|): 1.0 for equal strings, 0.0 with nothing in common."""
    if not a and not b:
        return 1.0
    row = [0] * (len(b) + 1)
    for ch in a:
        diagonal = 0
        for j, other in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if ch == other else max(row[j], row[j - 1])
    return 2 * row[-1] / (len(a) + len(b))


class ReverseText(TaskSet):
    name = "reverse_text"
    system_prompt = "Reverse the text you are given. Answer with the reversed text only."

    def rows(self):
        return reverse_text(
            self.args.get("n", 10_000), seed=self.args.get("seed", 0), env=self.name
        )

    @reward(weight=1.0)
    def exact(self, text: str, answer: str) -> float:
        return float(text.strip() == answer)

    @reward(weight=0.5)
    def partial(self, text: str, answer: str) -> float:
        return lcs_ratio(text.strip(), answer)

    @group_reward(weight=0.25)
    def concise(self, texts: list[str], rewards: list[dict[str, float]]) -> list[float]:
        """1 for the shortest exactly-correct answer(s) of the group, 0 for the rest."""
        correct = [len(t) for t, r in zip(texts, rewards, strict=True) if r.get("exact") == 1.0]
        shortest = min(correct, default=None)
        return [
            float(r.get("exact") == 1.0 and len(t) == shortest)
            for t, r in zip(texts, rewards, strict=True)
        ]

    @metric
    def answer_chars(self, text: str) -> float:
        return float(len(text))


class TerseReverseText(ReverseText):
    """reverse_text with the word alone as the user turn: no system prompt, no instruction.
    Tasks, ids, answers and rewards are reverse_text's own."""

    system_prompt = None
    defaults: dict[str, Any] = {
        "group_size": 8,
        "sampling": {"temperature": 1.0, "max_tokens": 16},
    }

    def messages(self, task: TaskPublished) -> Messages:
        return [{"role": "user", "content": task.answer[::-1]}]
