"""reverse_text as a verifiers 0.4 (V1) taskset, for `bench/vs_verifiers.py --v1` (imported in
the bench's verifiers venv, never by rlbus): the tasks rlbus's reverse_text environment
evaluates, read from the JSONL file the bench writes, with its system prompt and its two
rewards (exact reversal, and partial credit by longest common subsequence)."""

from __future__ import annotations

import json

import verifiers.v1 as vf

__all__ = ["ReverseTextTaskset"]


def lcs_ratio(a: str, b: str) -> float:
    """2 * |LCS(a, b)| / (|a| + |b|), as rlbus's built-in reverse_text scores it
    (environment/reverse_text.py)."""
    if not a and not b:
        return 1.0
    row = [0] * (len(b) + 1)
    for ch in a:
        diagonal = 0
        for j, other in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if ch == other else max(row[j], row[j - 1])
    return 2 * row[-1] / (len(a) + len(b))


class ReverseTextData(vf.TaskData):
    answer: str = ""


class ReverseTextTask(vf.Task[ReverseTextData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.reward(weight=0.5)
    async def partial(self, trace: vf.Trace) -> float:
        return lcs_ratio(trace.last_reply.strip(), self.data.answer)


class ReverseTextConfig(vf.TasksetConfig):
    path: str = ""
    """The JSONL file of tasks: {"system", "prompt", "answer"} per line."""


class ReverseTextTaskset(vf.Taskset[ReverseTextTask, ReverseTextConfig]):
    def load(self) -> list[ReverseTextTask]:
        with open(self.config.path) as rows:
            return [
                ReverseTextTask(
                    ReverseTextData(
                        prompt=row["prompt"], system_prompt=row["system"], answer=row["answer"]
                    ),
                    self.config.task,
                )
                for row in map(json.loads, rows)
            ]
