"""verifiers environments in rlbus (`verifiers:NAME`), defined the verifiers way in
examples/verifiers: the same completions scored by verifiers' own rubric and by rlbus's adapter
give the same rewards; rlbus's harnesses and verifiers' own rollout loop, against the same
scripted model, end with the same rewards; `rlbus eval verifiers:NAME` runs through the bus into
the store; `rlbus run` trains on one."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import verifiers as vf
from support import ScriptedModel, ScriptedServer
from support.isolated import isolated_settings, running_sink

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.config import ConfigError, Settings, settings_variables
from rlbus.environment import Environment, Scorer, load_environment
from rlbus.environment.verifiers import plain_messages
from rlbus.producers.interception import InterceptionServer
from rlbus.producers.rollouts import RolloutRunner
from rlbus.schemas import RolloutCompleted, group_id_of
from rlbus.schemas.chat import text_of

ENVS = Path(__file__).resolve().parents[2] / "examples" / "verifiers"


@pytest.fixture(autouse=True)
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example environments are installed the way `vf-eval` finds them: importable."""
    monkeypatch.syspath_prepend(str(ENVS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("OPENAI_API_KEY", "scripted")


def _word(messages: list[dict[str, Any]]) -> str:
    user = next(m for m in reversed(messages) if m.get("role") == "user")
    return text_of(user.get("content")).split()[-1]


def varied(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    """A model that depends on the conversation only: right, half right, padded or wrong."""
    word = _word(messages)
    answer = [word[::-1], word[::-1][:3], f" {word[::-1]}\n", word][sum(map(ord, word)) % 4]
    return {"content": answer}


def tool_user(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    """Calls a tool first (`reverse` mostly; `count_letters` or a tool that does not exist for
    some words), then answers with what the last tool said."""
    results = [m for m in messages if m.get("role") == "tool"]
    if results:
        return {"content": text_of(results[-1].get("content"))}
    word = _word(messages)
    name = ["reverse", "reverse", "count_letters", "nonexistent"][sum(map(ord, word)) % 4]
    call = {"id": "call_0", "type": "function"}
    call["function"] = {"name": name, "arguments": json.dumps({"text": word})}
    return {"content": None, "tool_calls": [call]}


def guesser(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    """Guesses 1, 2, 3, ... one per turn."""
    return {"content": str(1 + sum(m.get("role") == "assistant" for m in messages))}


def vf_evaluate(env: Environment, url: str, n: int, r: int) -> list[dict[str, Any]]:
    """verifiers' own evaluation (its rollout loop and rubric) of the first n examples."""
    client = vf.ClientConfig(api_base_url=url, api_key_var="OPENAI_API_KEY", max_retries=0)
    vf_env = env.taskset.vf_env
    results = asyncio.run(
        vf_env.evaluate(client, "scripted", num_examples=n, rollouts_per_example=r)
    )
    return results["outputs"]


def as_rollouts(env: Environment, outputs: list[dict[str, Any]]) -> list[list[RolloutCompleted]]:
    """verifiers' stored completions as the rollouts rlbus would have stored, by example."""
    tasks = list(env.eval_tasks("r"))
    groups: dict[int, list[RolloutCompleted]] = {}
    for out in outputs:
        task = tasks[out["example_id"]]
        group = groups.setdefault(out["example_id"], [])
        group.append(
            RolloutCompleted(
                rollout_id=f"{task.task_id}-{len(group)}",
                group_id=group_id_of(task),
                task_id=task.task_id,
                env=env.id,
                sample_index=len(group),
                prompt=task.prompt,
                completion=plain_messages(out["completion"]),
                answer=task.answer,
                info=task.info,
            )
        )
    return list(groups.values())


def scores_of(env: Environment, groups: list[list[RolloutCompleted]]) -> list[tuple]:
    async def score() -> list:
        scorer = Scorer(env)
        return [s for g in groups for s in await scorer.score(g)]

    return [
        (round(s.reward, 9), {k: round(v, 9) for k, v in {**s.rewards, **s.metrics}.items()})
        for s in asyncio.run(score())
    ]


def vf_scores(outputs: list[dict[str, Any]]) -> list[tuple]:
    ordered = sorted(outputs, key=lambda o: o["example_id"])  # stable: sample order kept
    return [
        (round(o["reward"], 9), {k: round(float(v), 9) for k, v in o["metrics"].items()})
        for o in ordered
    ]


def rlbus_rollouts(env: Environment, n: int, r: int) -> list[list[RolloutCompleted]]:
    """rlbus's harness (as the env producer runs it, without the bus) over the first n tasks."""

    async def run() -> list[list[RolloutCompleted]]:
        async with InterceptionServer.of(env.config) as server:
            runner = RolloutRunner(env, server)
            groups = []
            for task in env.eval_tasks("r").take(n):
                task.group_size = r
                groups.append([o.rollout for o in await runner.run_group(task)])
            return groups

    return asyncio.run(run())


def load(name: str, url: str, **args: Any) -> Environment:
    overrides = {"args": args, "model": {"name": "scripted", "base_url": url}}
    return load_environment(f"verifiers:{name}", {**overrides, "runtime": {"kind": "local"}})


@pytest.mark.parametrize(
    ("name", "script", "args"),
    [
        ("vf_reverse_text", varied, {"eval_n": 8}),
        ("vf_word_tools", tool_user, {"n": 8}),
    ],
)
@pytest.mark.slow
def test_stored_completions_score_the_same_in_verifiers_and_rlbus(
    name: str, script: Any, args: dict[str, Any]
) -> None:
    with ScriptedServer(ScriptedModel(chat=script)) as server:
        env = load(name, f"{server.url}/v1", **args)
        outputs = vf_evaluate(env, f"{server.url}/v1", n=8, r=3)
    rewards = vf_scores(outputs)
    assert len(rewards) == 24 and len({r for r, _ in rewards}) > 1  # the rewards differ
    assert scores_of(env, as_rollouts(env, outputs)) == rewards


QUIRKS = """
import verifiers as vf
from datasets import Dataset

async def length(completion, parser) -> float:
    return float(len(parser.parse_answer(completion) or ""))

def strict(completion, answer, parser) -> float:
    got = parser.parse_answer(completion) or ""
    if got != answer:
        raise ValueError(f"{got!r} is not {answer!r}")
    return 1.0

def remember(completion, state, parser) -> float:
    state["seen"] = parser.parse_answer(completion)
    return 0.0

def recall(state, answer, **kwargs) -> float:
    return float(state.get("seen") == answer) + 0.5 * float("question" in kwargs)

def load_environment():
    words = ["abcde", "hello", "verify", "rlbus"]
    rows = [{"question": f"Reverse the text: {w}", "answer": w[::-1]} for w in words]
    rubric = vf.Rubric(funcs=[length, strict, remember, recall], weights=[0.1, 1.0, 0.0, 2.0])
    return vf.SingleTurnEnv(eval_dataset=Dataset.from_list(rows), rubric=rubric)
"""


def test_async_raising_and_state_sharing_functions_score_as_in_verifiers(tmp_path: Path) -> None:
    """An async function, one that raises (0, as in verifiers), one that leaves something in
    state for the next, and one taking **kwargs (which sees the row's columns)."""
    (tmp_path / "vf_quirks.py").write_text(QUIRKS)
    sys.path.insert(0, str(tmp_path))
    try:
        with ScriptedServer(ScriptedModel(chat=varied)) as server:
            env = load("vf_quirks", f"{server.url}/v1")
            outputs = vf_evaluate(env, f"{server.url}/v1", n=4, r=2)
    finally:
        sys.path.remove(str(tmp_path))
    rewards = vf_scores(outputs)
    assert {m["strict"] for _, m in rewards} == {0.0, 1.0}  # some raised
    assert {m["recall"] for _, m in rewards} == {0.5, 1.5}
    assert scores_of(env, as_rollouts(env, outputs)) == rewards


def test_the_mapping_of_a_single_turn_environment() -> None:
    env = load("vf_reverse_text", "http://127.0.0.1:9/v1", n=3, eval_n=2)
    rules = env.rules
    assert [(r.name, r.weight) for r in rules.rewards] == [("exact", 1.0), ("partial", 0.5)]
    assert [r.name for r in rules.metrics] == ["answer_chars", "num_turns"]
    assert [(r.name, r.weight) for r in rules.group_rewards] == [("concise", 0.25)]
    c = env.config
    assert (c.harness.kind, c.sampling.temperature, c.sampling.max_tokens) == ("single", 0.7, 32)
    train, test = list(env.tasks()), list(env.eval_tasks())
    assert (len(train), len(test)) == (3, 2) and {t.env for t in train} == {"vf_reverse_text"}
    # The prompt verifiers formatted: system prompt, few-shot, then the question.
    assert [m["role"] for m in test[0].prompt] == ["system", "user", "assistant", "user"]
    assert test[0].info["verifiers"]["question"] == text_of(test[0].prompt[-1]["content"])
    assert (test[0].split, train[0].split) == ("test", "train")
    tools = load("vf_word_tools", "http://127.0.0.1:9/v1", max_turns=3)
    assert (tools.config.harness.kind, tools.config.harness.max_turns) == ("tools", 3)
    assert [t.name for t in tools.rules.tools] == ["reverse", "count_letters"]
    toml = {"harness": {"max_turns": 2}, "id": "renamed"}
    renamed = load_environment("verifiers:vf_word_tools", toml)
    assert (renamed.config.harness.max_turns, renamed.id) == (2, "renamed")  # TOML wins


def test_what_is_not_mapped_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "vf_stateful.py").write_text(
        "import verifiers as vf\nfrom datasets import Dataset\n"
        "class Stateful(vf.StatefulToolEnv):\n"
        "    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs):\n"
        "        return {**tool_args, 'state': state}\n"
        "def load_environment():\n"
        "    return Stateful(dataset=Dataset.from_list([{'question': 'q', 'answer': 'a'}]))\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ConfigError, match="a Stateful: tools with injected state"):
            load_environment("verifiers:vf_stateful")
    finally:
        sys.path.remove(str(tmp_path))
    with pytest.raises(ConfigError, match="verifiers:no_such_env: Could not import"):
        load_environment("verifiers:no_such_env")


@pytest.mark.parametrize(
    ("name", "script", "args"),
    [
        ("vf_reverse_text", varied, {"eval_n": 6}),
        ("vf_word_tools", tool_user, {"n": 6}),
        ("vf_guess_number", guesser, {"n": 6, "high": 6, "patience": 4}),
    ],
)
def test_rlbus_harnesses_end_where_verifiers_own_loop_ends(
    name: str, script: Any, args: dict[str, Any]
) -> None:
    with ScriptedServer(ScriptedModel(chat=script)) as server:
        env = load(name, f"{server.url}/v1", **args)
        outputs = vf_evaluate(env, f"{server.url}/v1", n=6, r=2)
        groups = rlbus_rollouts(env, n=6, r=2)
    assert all(r.status == "ok" for g in groups for r in g), [r.error for g in groups for r in g]
    theirs = [(reward, metrics) for reward, metrics in vf_scores(outputs)]
    assert scores_of(env, groups) == theirs
    if name == "vf_guess_number":
        assert {metrics["solved"] for _, metrics in theirs} == {0.0, 1.0}


@pytest.fixture(scope="module")
def eval_settings(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    root = tmp_path_factory.mktemp("vf-eval")
    settings = isolated_settings(broker, root, flush_interval_s=0.1)
    with running_sink(settings, root / "logs"):
        yield settings


def test_rlbus_eval_of_a_verifiers_environment_end_to_end(eval_settings: Settings) -> None:
    with ScriptedServer(ScriptedModel(chat=varied)) as server:
        url = f"{server.url}/v1"
        out = subprocess.run(
            [sys.executable, "-m", "rlbus", "eval", "verifiers:vf_reverse_text"]
            + ["--model", "scripted", "--base-url", url, "-n", "6", "-r", "2"]
            + ["--run-id", "vf-e2e"],
            env={**os.environ, **settings_variables(eval_settings), "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        env = load("vf_reverse_text", url)
        theirs = vf_scores(vf_evaluate(env, url, n=6, r=2))
    assert "exact" in out.stdout and "concise" in out.stdout
    with open_store(eval_settings.store.url, read_only=True) as store:
        tasks = store.query("SELECT DISTINCT env FROM tasks FINAL WHERE run_id = 'vf-e2e'").rows
        scored = store.query(
            "SELECT s.reward FROM scored AS s FINAL JOIN (SELECT task_id, "
            "JSONExtractInt(info, 'verifiers', 'example_id') AS example FROM tasks FINAL "
            "WHERE run_id = 'vf-e2e') AS t USING task_id "
            "WHERE s.run_id = 'vf-e2e' ORDER BY t.example, s.sample_index"
        ).rows
    assert tasks == [("vf_reverse_text",)]
    assert [round(r, 9) for (r,) in scored] == [reward for reward, _ in theirs]


RUN = """
run_id = "vf-train"
max_steps = 2

[orchestrator]
tasks_per_step = 4
eval_every = 0
seq_len = 512

[envs.vf_reverse_text]
path = "env.toml"
algorithm.name = "grpo"
"""

ENV = """
[env]
taskset = "verifiers:vf_reverse_text"
group_size = 4
args = { n = 64 }

[env.sampling]
temperature = 1.0
max_tokens = 8
"""


@pytest.mark.slow
def test_rlbus_run_trains_on_a_verifiers_environment(tmp_path: Path) -> None:
    from rlbus.consumers.inference.model_init import init_model

    init_model(tmp_path / "tiny", seed=0)
    (tmp_path / "rl.toml").write_text(RUN)
    (tmp_path / "env.toml").write_text(ENV)
    out = subprocess.run(
        [sys.executable, "-m", "rlbus", "run", str(tmp_path / "rl.toml")]
        + ["--model", str(tmp_path / "tiny"), "--store.url", f"chdb://{tmp_path / 'store'}"]
        + ["--claim-check.url", str(tmp_path / "claims")],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "finished at step 2" in out.stdout
    with open_store(f"chdb://{tmp_path / 'store'}", read_only=True) as store:
        steps = store.query("SELECT step FROM train_steps FINAL WHERE run_id = 'vf-train'").rows
        scored = store.query(
            "SELECT DISTINCT env, arraySort(mapKeys(rewards)) FROM scored FINAL "
            "WHERE run_id = 'vf-train' AND status = 'ok'"
        ).rows
    assert sorted(steps) == [(1,), (2,)]
    assert scored == [("vf_reverse_text", ["concise", "exact", "partial"])]
