"""The tiny-model examples the learning recipe (`rlbus.launch.recipe`) runs on, each with a
scripted teacher that answers its tasks right: reverse_text (what `rlbus quickstart` runs) and
caesar. bench/learning.py takes them by name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rlbus.launch.recipe import IM_END, Teacher, prompt_bytes, reverse_teacher

EXAMPLES = Path(__file__).resolve().parent
ROTATED = re.compile(rb"(\d+) ([a-z]+)")


def caesar_teacher(prompt_ids: list[int]) -> list[int]:
    """caesar's right answer: the last "ROTATION word" of the prompt shifted back."""
    found = ROTATED.findall(prompt_bytes(prompt_ids))
    if not found:
        return [IM_END]
    rotation, word = int(found[-1][0]), found[-1][1]
    return [*(ord("a") + (ch - ord("a") - rotation) % 26 for ch in word), IM_END]


@dataclass(frozen=True)
class Example:
    """A tiny-model learning example: its directory, the environment file its rl.toml trains
    on, and a scripted teacher that answers its tasks right."""

    name: str
    env_file: str
    teacher: Teacher

    @property
    def dir(self) -> Path:
        return EXAMPLES / self.name

    @property
    def env_path(self) -> str:
        return str(self.dir / self.env_file)


REVERSE_TEXT = Example("reverse_text", "terse.toml", reverse_teacher)
CAESAR = Example("caesar", "env.toml", caesar_teacher)
BY_NAME = {e.name: e for e in (REVERSE_TEXT, CAESAR)}
