"""The learning recipe of the tiny-model examples (reverse_text, caesar), step by step,
through the event log:

1. a scripted teacher (the right answer, token in / token out) answers training tasks through
   the same env producer, interception server, judge and sink as any model;
2. `rlbus replay sft` trains a fresh tiny model on those rollouts' stored token ids;
3. `rlbus run EXAMPLE/rl.toml` runs GRPO from the SFT model, evaluating held-out tasks as it goes.

bench/learning.py and tests/test_learning.py run it; the SQL below computes the figures (each
example's task set has an `exact` reward).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlbus.bus import Bus
from rlbus.bus.store import Store, open_store
from rlbus.config import Settings
from rlbus.consumers.judge.main import run as run_judge
from rlbus.consumers.orchestrator.task_draw import Source, TaskSource
from rlbus.consumers.sink import run_sink
from rlbus.producers.environment import load_environment
from rlbus.producers.main import run as run_env_producer
from rlbus.testing import ScriptedModel, ScriptedServer

EXAMPLES = Path(__file__).resolve().parent
IM_END = 258
"""<|im_end|> of the byte tokenizer (`rlbus model init`): ends an assistant turn."""
WORD = re.compile(rb"([a-z]+)")
ROTATED = re.compile(rb"(\d+) ([a-z]+)")
TERSE_TEMPLATE = (
    "{%- for message in messages -%}{{- message['content'] ~ '<|im_end|>' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>' -}}{%- endif -%}"
)
"""Each turn is its text and <|im_end|>; the model's turn opens with <|im_start|>: no role
headers."""

HELD_OUT_SQL = """
SELECT JSONExtractInt(r.info, 'eval_version') AS version,
       round(avg(s.rewards['exact']), 4) AS exact_match,
       round(avg(s.reward), 4) AS mean_reward,
       count() AS rollouts
FROM scored AS s FINAL
INNER JOIN (SELECT rollout_id, info FROM rollouts FINAL
            WHERE run_id = {run:String} AND JSONExtractString(info, 'split') = 'test') AS r
        ON s.rollout_id = r.rollout_id
WHERE s.run_id = {run:String}
GROUP BY version ORDER BY version
"""
"""Held-out exact match per evaluated weights version (tasks the run never trained on)."""

TRAIN_REWARD_SQL = """
SELECT s.policy_version AS version, round(avg(s.rewards['exact']), 4) AS exact_match,
       round(avg(s.reward), 4) AS mean_reward, count() AS rollouts,
       round(min(toUnixTimestamp64Micro(s.ts)) / 1e6, 3) AS first_ts
FROM scored AS s FINAL
INNER JOIN (SELECT rollout_id FROM rollouts FINAL
            WHERE run_id = {run:String} AND JSONExtractString(info, 'split') = 'train') AS r
        ON s.rollout_id = r.rollout_id
WHERE s.run_id = {run:String}
GROUP BY version ORDER BY version
"""
"""Training-rollout reward by the policy version that sampled them (the reward curve)."""


def _text(prompt_ids: list[int]) -> bytes:
    return bytes(i for i in prompt_ids if i < 256)


def reverse_teacher(prompt_ids: list[int]) -> list[int]:
    """reverse_text's right answer to the last word in the prompt, as byte tokens + <|im_end|>."""
    words = WORD.findall(_text(prompt_ids))
    return [*words[-1][::-1], IM_END] if words else [IM_END]


def caesar_teacher(prompt_ids: list[int]) -> list[int]:
    """caesar's right answer: the last "ROTATION word" of the prompt shifted back."""
    found = ROTATED.findall(_text(prompt_ids))
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
    teacher: Callable[[list[int]], list[int]]

    @property
    def dir(self) -> Path:
        return EXAMPLES / self.name

    @property
    def env_path(self) -> str:
        return str(self.dir / self.env_file)


REVERSE_TEXT = Example("reverse_text", "terse.toml", reverse_teacher)
CAESAR = Example("caesar", "env.toml", caesar_teacher)
BY_NAME = {e.name: e for e in (REVERSE_TEXT, CAESAR)}


def init_terse_model(path: Path, seed: int = 0) -> Path:
    """`rlbus model init` (tiny llama, byte tokenizer) with the terse chat template."""
    from transformers import AutoTokenizer

    from rlbus.consumers.inference.model_init import init_model

    init_model(path, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TERSE_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def train_tasks(example: Example, settings: Settings, n: int, seed: int = 1) -> list:
    """`n` training-split tasks (never one of the held-out ones the RL run evaluates on)."""
    env = load_environment(example.env_path)
    source = TaskSource([Source(env, 1.0)], settings.run_id, held_out_fraction=0.05, seed=seed)
    return [source.next_train() for _ in range(n)]


async def collect_teacher(
    example: Example, settings: Settings, model: Path, n: int, timeout_s: float = 300
) -> int:
    """Run `n` training tasks with the scripted teacher; returns how many were scored in the
    store."""
    with ScriptedServer(
        ScriptedModel(tokens=example.teacher, model="teacher", record=False)
    ) as teacher:
        env = load_environment(
            example.env_path,
            {
                "group_size": 1,
                "max_concurrent_rollouts": 128,
                "sampling": {"temperature": 1.0, "max_tokens": 16},
                "model": {
                    "name": "teacher",
                    "base_url": teacher.url + "/v1",
                    "mode": "train",
                    "tokenizer": str(model),
                },
            },
        )
        stop = asyncio.Event()
        with open_store(settings.store.url) as store:
            async with Bus.of(settings) as bus:
                roles = [
                    asyncio.create_task(run_sink(settings, store, stop)),
                    asyncio.create_task(run_env_producer(settings, env, stop)),
                    asyncio.create_task(run_judge(settings, [env], stop)),
                ]
                await bus.publish_many(train_tasks(example, settings, n))
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout_s
                while (scored := _count(store, settings.run_id)) < n and loop.time() < deadline:
                    for role in roles:
                        if role.done():
                            role.result()
                    await asyncio.sleep(0.5)
                stop.set()
                await asyncio.gather(*roles)
        return scored


def _count(store: Store, run_id: str) -> int:
    return int(
        store.query(
            "SELECT count() FROM scored FINAL WHERE run_id = {r:String}", {"r": run_id}
        ).rows[0][0]
    )


def held_out(store: Store, run_id: str) -> list[tuple[int, float, float, int]]:
    return [tuple(r) for r in store.query(HELD_OUT_SQL, {"run": run_id}).rows]  # type: ignore[misc]


def reward_curve(store: Store, run_id: str) -> list[tuple]:
    return [tuple(r) for r in store.query(TRAIN_REWARD_SQL, {"run": run_id}).rows]
