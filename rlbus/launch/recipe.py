"""The tiny-model learning recipe, through the event log (`rlbus quickstart` runs it;
bench/learning.py and tests/trainer/test_learning.py too):

1. a tiny model from `rlbus model init` with a chat template without role headers;
2. a scripted teacher (the right answer, token in / token out) answers training tasks through
   the same env producer, interception server, judge and sink as any model;
3. SFT on those rollouts' stored token ids (`rlbus replay sft`);
4. GRPO from the SFT model, evaluating held-out tasks as it goes.

The figures are rlbus.bus.store.reads.recipe's SQL (the task sets it is used with have an
`exact` reward).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbus.bus import Bus, free_port
from rlbus.bus.store import Store
from rlbus.bus.store.reads.recipe import HELD_OUT_SQL, SCORED_SQL, TRAIN_REWARD_SQL
from rlbus.bus.waiting import wait_until
from rlbus.clients.inference_client import healthy
from rlbus.config import Settings, data_dir, deep_merge
from rlbus.config.orchestrator import OrchestratorConfig
from rlbus.consumers.orchestrator.task_draw import TaskSource, WeightedEnvironment
from rlbus.environment import Environment, load_environment
from rlbus.launch.local_sink import LocalSink
from rlbus.launch.processes import RoleProcess, alive
from rlbus.launch.roles import build_role
from rlbus.launch.scripted_model import ScriptedModel, ScriptedServer
from rlbus.launch.supervisor import thread_env
from rlbus.schemas import TaskPublished

TERSE_ENV = "rlbus.environment.reverse_text:TerseReverseText"
"""reverse_text with the bare word as the user turn: what the tiny model learns."""
IM_END = 258
"""<|im_end|> of the byte tokenizer (`rlbus model init`): ends an assistant turn."""
TERSE_TEMPLATE = (
    "{%- for message in messages -%}{{- message['content'] ~ '<|im_end|>' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>' -}}{%- endif -%}"
)
"""Each turn is its text and <|im_end|>; the model's turn opens with <|im_start|>: no role
headers."""
HELD_OUT_FRACTION = OrchestratorConfig().held_out_fraction
"""The share of the task set no run trains on (the orchestrator's default)."""

Teacher = Callable[[list[int]], list[int]]
"""Prompt token ids -> the right answer's token ids, ending with <|im_end|>."""


def prompt_bytes(prompt_ids: list[int]) -> bytes:
    """The text of a byte-tokenizer prompt, special tokens left out."""
    return bytes(i for i in prompt_ids if i < 256)


def reverse_teacher(prompt_ids: list[int]) -> list[int]:
    """reverse_text's right answer to a byte-tokenizer prompt, as byte tokens + <|im_end|>."""
    # latin-1 maps each byte to one character and back: no prompt byte fails to decode
    answer = reversed_last_word(prompt_bytes(prompt_ids).decode("latin-1"))
    return [*answer.encode("latin-1"), IM_END]


def chat_teacher(tokenizer: str | Path, answer: Callable[[str], str]) -> Teacher:
    """A teacher for a model with its own tokenizer and chat template (SmolLM2's ChatML, say):
    `answer` maps the prompt's text, up to where the model's turn opens, to the right answer's
    text, which is returned as the tokenizer's ids followed by the token that ends a turn."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    # What the template puts after a user turn's text: the turn's end, then the model's turn
    # opening. Its first token is the one the model ends its own turn with.
    sentinel = "\x00"
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": sentinel}], tokenize=False, add_generation_prompt=True
    )
    after_user = str(rendered).rsplit(sentinel, 1)[1]
    end_of_turn = tok.encode(after_user, add_special_tokens=False)[0]

    def teach(prompt_ids: list[int]) -> list[int]:
        text = tok.decode(prompt_ids)
        if not text.endswith(after_user):
            raise ValueError(
                f"the prompt does not end as {tokenizer}'s chat template opens the model's "
                f"turn ({after_user!r}): ...{text[-80:]!r}"
            )
        reply = answer(text[: -len(after_user)])
        return [*tok.encode(reply, add_special_tokens=False), end_of_turn]

    return teach


def reversed_last_word(text: str) -> str:
    """reverse_text's right answer to a prompt's text: its last lowercase word, reversed."""
    words = re.findall(r"[a-z]+", text)
    return words[-1][::-1] if words else ""


def init_terse_model(path: Path, seed: int = 0) -> Path:
    """`rlbus model init` (tiny llama, byte tokenizer) with the terse chat template."""
    from transformers import AutoTokenizer

    from rlbus.consumers.inference.model_init import init_model

    init_model(path, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TERSE_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def task_source(
    env: Environment, run_id: str, held_out_fraction: float = HELD_OUT_FRACTION, seed: int = 0
) -> TaskSource:
    """The orchestrator's task draw for `env`: the same held-out split as a run's."""
    return TaskSource([WeightedEnvironment(env, 1.0)], run_id, held_out_fraction, seed)


def train_tasks(
    env: Environment,
    run_id: str,
    n: int,
    held_out_fraction: float = HELD_OUT_FRACTION,
    seed: int = 1,
) -> list[TaskPublished]:
    """`n` training-split tasks (never one of the held-out ones a run evaluates on)."""
    source = task_source(env, run_id, held_out_fraction, seed)
    return [source.next_train() for _ in range(n)]


def held_out_tasks(
    env: Environment,
    run_id: str,
    n: int,
    held_out_fraction: float = HELD_OUT_FRACTION,
    group_size: int = 1,
) -> list[TaskPublished]:
    """The first `n` held-out tasks as a run's evaluation of version 0 (what HELD_OUT_SQL
    reads): the tasks and rollouts per task a run with these settings evaluates on."""
    return task_source(env, run_id, held_out_fraction).eval_set(0, n, group_size)


@dataclass(frozen=True)
class Endpoint:
    """A train-mode model endpoint: token ids in and out, prompts rendered with `tokenizer`."""

    name: str
    url: str
    """Its /v1 URL."""
    tokenizer: Path


async def answer_tasks(
    settings: Settings,
    env_spec: str,
    endpoint: Endpoint,
    sink: LocalSink,
    expected: int,
    publish: Sequence[TaskPublished] = (),
    overrides: dict[str, Any] | None = None,
    on_count: Callable[[int], None] | None = None,
    timeout_s: float = 300,
) -> int:
    """Run settings.run_id's tasks (publishing `publish` first) with an env producer and a judge
    of `env_spec` (with `overrides`: EnvConfig fields) against `endpoint`, until `expected`
    rollouts of the run are scored in the store; returns how many are."""
    model = {
        "name": endpoint.name,
        "base_url": endpoint.url,
        "mode": "train",
        "tokenizer": str(endpoint.tokenizer),
    }
    env = load_environment(
        env_spec,
        deep_merge({"max_concurrent_rollouts": 128, **(overrides or {})}, {"model": model}),
    )
    scope = {"run": settings.run_id}
    stop = asyncio.Event()
    async with Bus.of(settings) as bus:
        roles = [
            asyncio.create_task(build_role("env", settings, env).run(stop)),
            asyncio.create_task(build_role("judge", settings, [env]).run(stop)),
        ]
        try:
            await bus.publish_many(list(publish))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while (scored := await asyncio.to_thread(sink.count, SCORED_SQL, scope)) < expected:
                if on_count is not None:
                    on_count(scored)
                for role in roles:
                    if role.done():
                        role.result()
                if loop.time() > deadline:
                    raise TimeoutError(
                        f"{scored} of {expected} rollouts of run {settings.run_id} scored in "
                        f"the store after {timeout_s:.0f}s"
                    )
                await asyncio.sleep(0.5)
        finally:
            stop.set()
            await asyncio.gather(*roles)
    if on_count is not None:
        on_count(scored)
    return scored


async def collect_teacher(
    settings: Settings,
    teacher: Teacher,
    tokenizer: Path,
    sink: LocalSink,
    expected: int,
    publish: Sequence[TaskPublished] = (),
    env_spec: str = TERSE_ENV,
    overrides: dict[str, Any] | None = None,
    on_count: Callable[[int], None] | None = None,
) -> int:
    """`answer_tasks` with a scripted teacher as the model, one rollout per task."""
    one = deep_merge(overrides or {}, {"group_size": 1})
    with ScriptedServer(ScriptedModel(tokens=teacher, model="teacher", record=False)) as server:
        endpoint = Endpoint("teacher", server.url + "/v1", tokenizer)
        return await answer_tasks(
            settings, env_spec, endpoint, sink, expected, publish, one, on_count
        )


async def evaluate(
    settings: Settings,
    model: Path,
    sink: LocalSink,
    expected: int,
    publish: Sequence[TaskPublished] = (),
    env_spec: str = TERSE_ENV,
    overrides: dict[str, Any] | None = None,
    on_count: Callable[[int], None] | None = None,
) -> int:
    """`answer_tasks` with `model` served by the built-in engine as `rlbus run` serves it: a
    process of its own (in this one it would share the GIL with the env producer and judge)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    args = ["--model", str(model.resolve()), "--port", str(port), "--threads", "1"]
    logs = data_dir(settings) / "logs"
    server = RoleProcess("inference", settings, logs, args, thread_env(1))
    try:
        await wait_until(lambda: healthy(url), 300, f"inference at {url}", check=alive(server))
        endpoint = Endpoint(model.name, url, model)
        return await answer_tasks(
            settings, env_spec, endpoint, sink, expected, publish, overrides, on_count
        )
    finally:
        server.stop()


def held_out(store: Store, run_id: str) -> list[tuple[int, float, float, int]]:
    """(version, exact match, mean reward, rollouts) of each held-out evaluation of a run."""
    return [tuple(r) for r in store.query(HELD_OUT_SQL, {"run": run_id}).rows]


def reward_curve(store: Store, run_id: str) -> list[tuple]:
    return [tuple(r) for r in store.query(TRAIN_REWARD_SQL, {"run": run_id}).rows]
