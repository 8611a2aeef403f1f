"""A single-turn verifiers environment, written the verifiers way (nothing rlbus in it): reverse
a word, with a system prompt, a few-shot example, a parser, two weighted rewards, a metric and a
group reward. `rlbus eval verifiers:vf_reverse_text` runs it with this directory on PYTHONPATH."""

from __future__ import annotations

import random

import verifiers as vf
from datasets import Dataset

LETTERS = "abcdefghijklmnopqrstuvwxyz"
SYSTEM = "Reverse the text you are given. Answer with the reversed text only."
FEW_SHOT = [
    {"role": "user", "content": "Reverse the text: abc"},
    {"role": "assistant", "content": "cba"},
]


def lcs_ratio(a: str, b: str) -> float:
    """2 * |LCS(a, b)| / (|a| + |b|)."""
    if not a and not b:
        return 1.0
    row = [0] * (len(b) + 1)
    for ch in a:
        diagonal = 0
        for j, other in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if ch == other else max(row[j], row[j - 1])
    return 2 * row[-1] / (len(a) + len(b))


def words(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(5, 8)))
        rows.append(
            {
                "question": f"Reverse the text: {word}",
                "answer": word[::-1],
                "info": {"n": len(word)},
            }
        )
    return rows


def exact(completion, answer, parser) -> float:
    return float((parser.parse_answer(completion) or "") == answer)


def partial(completion, answer, parser) -> float:
    return lcs_ratio(parser.parse_answer(completion) or "", answer)


def answer_chars(completion, parser) -> float:
    return float(len(parser.parse_answer(completion) or ""))


def concise(completions, answers, parser) -> list[float]:
    """1 for the shortest exactly-correct answer(s) of the group."""
    parsed = [parser.parse_answer(c) or "" for c in completions]
    correct = [len(p) for p, a in zip(parsed, answers, strict=True) if p == a]
    shortest = min(correct, default=None)
    return [float(p == a and len(p) == shortest) for p, a in zip(parsed, answers, strict=True)]


def load_environment(n: int = 200, seed: int = 0, eval_n: int = 50) -> vf.Environment:
    parser = vf.Parser(extract_fn=str.strip)
    rubric = vf.Rubric(funcs=[exact, partial], weights=[1.0, 0.5], parser=parser)
    rubric.add_metric(answer_chars)
    rubric.add_reward_func(concise, weight=0.25)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(words(n, seed)),
        eval_dataset=Dataset.from_list(words(eval_n, seed + 1)),
        system_prompt=SYSTEM,
        few_shot=FEW_SHOT,
        parser=parser,
        rubric=rubric,
        sampling_args={"temperature": 0.7, "max_tokens": 32},
    )
