"""A tool-calling verifiers environment (vf.ToolEnv): the model reverses a word with the
`reverse` tool and answers with the result; the tool-call counts verifiers adds are metrics."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset
from vf_reverse_text import words


def reverse(text: str) -> str:
    """Reverse a piece of text.

    Args:
        text: the text to reverse
    """
    return text[::-1]


def count_letters(text: str) -> int:
    """Count the letters of a piece of text.

    Args:
        text: the text whose letters to count
    """
    return sum(ch.isalpha() for ch in text)


def correct(completion, answer, parser) -> float:
    return float((parser.parse_answer(completion) or "").strip() == answer)


def load_environment(n: int = 50, seed: int = 0, max_turns: int = 4) -> vf.Environment:
    parser = vf.Parser()
    return vf.ToolEnv(
        eval_dataset=Dataset.from_list(words(n, seed)),
        system_prompt="Use the reverse tool, then answer with its result only.",
        tools=[reverse, count_letters],
        max_turns=max_turns,
        parser=parser,
        rubric=vf.Rubric(funcs=[correct], parser=parser),
    )
