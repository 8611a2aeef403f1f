"""`rlbus eval` end to end: real broker, a sink process holding real chdb, a scripted model on
127.0.0.1 (or the built-in inference engine with a tiny model, for train mode). One sink serves
the whole module; each test is its own run."""

from __future__ import annotations

import itertools
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from support import ScriptedServer
from support.isolated import isolated_settings, running_sink
from typer.testing import CliRunner

from rlbus.bus import EmbeddedBroker
from rlbus.bus.server_thread import ServerThread
from rlbus.bus.store import open_store
from rlbus.commands import eval as eval_command
from rlbus.config import Settings
from rlbus.config.env import cli_overrides
from rlbus.environment import load_environment
from rlbus.launch.eval import EvalResult, run_eval
from rlbus.schemas import TokenRecord, TraceNode
from rlbus.schemas.packed import mask, tokens
from rlbus.schemas.samples import trace_samples

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def settings(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    root = tmp_path_factory.mktemp("eval")
    settings = isolated_settings(broker, root, flush_interval_s=0.1)
    with running_sink(settings, root / "logs"):
        yield settings


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:  # answers reverse-text tasks correctly
        yield server


def rows(settings: Settings, sql: str, run_id: str) -> list[tuple]:
    with open_store(settings.store.url, read_only=True) as store:
        return store.query(sql, {"run": run_id}).rows


def evaluate(
    settings: Settings, spec: str, upstream: ScriptedServer, n: int, **overrides: object
) -> EvalResult:
    env = load_environment(
        spec,
        {**cli_overrides("scripted", f"{upstream.url}/v1", None, None, None, None), **overrides},
    )
    return run_eval(env, settings, n=n, run_id=f"run-{uuid.uuid4().hex[:8]}", show_progress=False)


def test_256_rollouts_at_concurrency_64_land_exactly_once(
    settings: Settings, upstream: ScriptedServer
) -> None:
    result = evaluate(
        settings,
        str(EXAMPLES / "reverse_text"),
        upstream,
        n=64,
        group_size=4,
        max_concurrent_rollouts=64,
    )
    assert (result.tally.rollouts, result.tally.errors) == (256, 0)
    report = result.report
    assert (report.rollouts, report.tasks, report.mean_reward) == (256, 64, 1.75)
    assert (
        report.rewards == {"concise": 1.0, "exact": 1.0, "partial": 1.0}
        and report.pass_at[4] == 1.0
    )
    counts = {
        table: rows(
            settings,
            f"SELECT count(), uniqExact({key}) FROM {table} WHERE run_id = {{run:String}}",
            result.run_id,
        )[0]
        for table, key in (
            ("tasks", "task_id"),
            ("rollouts", "rollout_id"),
            ("scored", "rollout_id"),
            ("trace_nodes", "node_id"),
            ("tokens", "rollout_id"),
        )
    }
    # No FINAL: every event stored exactly once, not merely deduplicated on read.
    assert counts == {
        "tasks": (64, 64),
        "rollouts": (256, 256),
        "scored": (256, 256),
        "trace_nodes": (768, 768),
        "tokens": (256, 256),
    }


FAILING = """
import json, os, sys, time
from rlbus.environment import TaskSet, reward

class Failing(TaskSet):
    name = "failing"

    def rows(self):
        return [{"task_id": mode, "prompt": mode, "answer": "", "info": {"mode": mode}}
                for mode in ("ok", "crash", "sleep", "memory", "reward")]

    @reward
    def judged(self, info: dict, state: dict) -> float:
        if info["mode"] == "reward":
            raise RuntimeError("this reward always fails")
        return float(state["stdout"].strip() == "done")
"""

PROGRAM = """
import json, os, sys, time
mode = json.load(open(os.environ["RLBUS_TASK_FILE"]))["info"]["mode"]
if mode == "crash":
    raise RuntimeError("agent crashed on purpose")
if mode == "sleep":
    time.sleep(60)
if mode == "memory":
    hog = bytearray(4 << 30)
print("done")
"""


def test_failures_are_recorded_with_their_reason_and_the_eval_finishes(
    settings: Settings, upstream: ScriptedServer, tmp_path: Path
) -> None:
    (tmp_path / "env.py").write_text(FAILING)
    (tmp_path / "agent.py").write_text(PROGRAM)
    (tmp_path / "env.toml").write_text(
        textwrap.dedent("""
        [env]
        taskset = "env.py"
        [env.harness]
        kind = "command"
        command = ["{python}", "{env_dir}/agent.py"]
        [env.runtime]
        kind = "subprocess"
        timeout_s = 10
        memory_mb = 512
    """)
    )
    result = evaluate(settings, str(tmp_path), upstream, n=5)
    assert (result.tally.rollouts, result.tally.errors) == (5, 4)
    assert result.report.errors == {"exit": 1, "memory": 1, "reward": 1, "timeout": 1}
    stored = {
        task: (status, kind, error)
        for task, status, kind, error in rows(
            settings,
            "SELECT r.task_id, s.status, r.error_kind, s.error FROM scored AS s FINAL "
            "INNER JOIN (SELECT * FROM rollouts FINAL WHERE run_id = {run:String}) AS r USING "
            "rollout_id "
            "WHERE s.run_id = {run:String}",
            result.run_id,
        )
    }
    assert stored["ok"] == ("ok", "", "")
    assert (
        stored["crash"][:2] == ("error", "exit")
        and "agent crashed on purpose" in stored["crash"][2]
    )
    assert stored["sleep"][:2] == ("error", "timeout") and "10s time limit" in stored["sleep"][2]
    assert (
        stored["memory"][:2] == ("error", "memory")
        and "512 MiB memory limit" in stored["memory"][2]
    )
    assert stored["reward"] == (
        "error",
        "",
        "reward 'judged' raised RuntimeError: this reward always fails",
    )


def test_in_process_harness_crash_is_an_errored_rollout(
    settings: Settings, upstream: ScriptedServer, tmp_path: Path
) -> None:
    (tmp_path / "env.py").write_text(
        textwrap.dedent("""
        from rlbus.environment import TaskSet, reward, user
        class Crashy(TaskSet):
            def rows(self):
                return [{"prompt": f"Reverse the text: w{i}", "answer": f"{i}w"} for i in range(4)]
            @user
            def referee(self, task, turn: int) -> str | None:
                if task.answer == "2w":
                    raise KeyError("the user simulator lost its script")
                return None
            @reward
            def exact(self, text: str, answer: str) -> float:
                return float(text == answer)
    """)
    )
    result = evaluate(settings, f"{tmp_path / 'env.py'}", upstream, n=4)
    assert (result.tally.rollouts, result.tally.errors, result.report.errors) == (
        4,
        1,
        {"harness": 1},
    )
    ((error, completion),) = rows(
        settings,
        "SELECT error, completion FROM rollouts FINAL "
        "WHERE run_id = {run:String} AND status = 'error'",
        result.run_id,
    )
    assert error.startswith("KeyError: 'the user simulator lost its script'")
    assert '"content":"2w"' in completion.replace(" ", "")  # what happened before the crash is kept


def test_command_agent_example_with_the_openai_client(
    settings: Settings, upstream: ScriptedServer
) -> None:
    result = evaluate(settings, str(EXAMPLES / "command_agent"), upstream, n=2)
    assert (result.tally.rollouts, result.tally.errors, result.report.rewards["exact"]) == (
        4,
        0,
        1.0,
    )
    calls = rows(
        settings,
        "SELECT rollout_id, count(), groupUniqArray(branch_id) FROM trace_nodes FINAL "
        "WHERE run_id = {run:String} AND sampled GROUP BY rollout_id",
        result.run_id,
    )
    assert sorted((n, tuple(b)) for _, n, b in calls) == [(2, ("main",))] * 4  # draft, then check


def test_cli_resume_skips_tasks_already_scored(
    settings: Settings, upstream: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = evaluate(settings, str(EXAMPLES / "reverse_text"), upstream, n=3, group_size=2)
    app, worker_app = typer.Typer(), typer.Typer()
    app.callback()(lambda: None)  # a command group, as in rlbus.cli, even with one command
    eval_command.register(app, worker_app)
    for key, value in {
        "RLBUS_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "RLBUS_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
        "RLBUS_STORE__URL": settings.store.url,
        "RLBUS_CLAIM_CHECK__URL": settings.claim_check.url,
    }.items():
        monkeypatch.setenv(key, value)
    args = [
        "eval",
        str(EXAMPLES / "reverse_text"),
        "--model",
        "scripted",
        "--base-url",
        f"{upstream.url}/v1",
        "-n",
        "5",
        "-r",
        "2",
        "-c",
        "8",
        "--resume",
    ]
    out = CliRunner().invoke(app, args, catch_exceptions=False, env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert first.run_id in out.output and "5 (3 resumed)" in out.output and "pass@2" in out.output
    assert rows(
        settings, "SELECT count() FROM scored FINAL WHERE run_id = {run:String}", first.run_id
    ) == [(10,)]
    missing = CliRunner().invoke(
        app, [*args[:3], "never-used-model", *args[4:]], env={"COLUMNS": "200"}
    )
    assert (
        missing.exit_code == 2
        and "no earlier run of reverse_text with model 'never-used-model'" in missing.output
    )


def test_train_mode_with_the_inference_engine_stored_trace_reproduces_prompts(
    settings: Settings, tmp_path: Path
) -> None:
    from rlbus.consumers.inference.model_init import init_model
    from rlbus.consumers.inference.service import build_app, build_backend

    model_dir = tmp_path / "tiny"
    init_model(model_dir)
    app = build_app(build_backend(model_dir), model_dir, model_name="tiny", renderer="template")
    with ServerThread(app, lifespan="on") as engine:
        env = load_environment(
            str(EXAMPLES / "guess_number"),
            {
                "group_size": 2,
                "harness": {"max_turns": 3},
                "sampling": {"max_tokens": 6},
                "model": {
                    "name": "tiny",
                    "base_url": f"{engine.url}/v1",
                    "mode": "train",
                    "tokenizer": str(model_dir),
                    "renderer": "template",
                },
            },
        )
        result = run_eval(
            env, settings, n=2, run_id=f"train-{uuid.uuid4().hex[:8]}", show_progress=False
        )
    assert result.tally.errors == 0
    with open_store(settings.store.url, read_only=True) as store:
        where, params = "run_id = {run:String}", {"run": result.run_id}
        records = store.read_events(TokenRecord, where, parameters=params)
        nodes = store.read_events(TraceNode, where, parameters=params)
    three_turns = 0
    for rollout_id in {r.rollout_id for r in records}:
        calls = sorted(
            (r for r in records if r.rollout_id == rollout_id), key=lambda r: r.call_index
        )
        own = [n for n in nodes if n.rollout_id == rollout_id]
        by_id = {n.node_id: n for n in own}
        for before, after in itertools.pairwise(calls):
            history = list(tokens(before.prompt_ids)) + list(tokens(before.completion_ids))
            assert list(tokens(after.prompt_ids))[: len(history)] == history
        for record in calls:  # the stored trace alone reproduces each prompt
            path, node = [], by_id[by_id[record.node_id].parent_id]
            while node is not None:
                path.append(node)
                node = by_id.get(node.parent_id)
            assert [t for n in reversed(path) for t in tokens(n.token_ids)] == list(
                tokens(record.prompt_ids)
            )
        (sample,) = trace_samples(own, calls)
        last = calls[-1]
        assert list(tokens(sample.input_ids)) == list(tokens(last.prompt_ids)) + list(
            tokens(last.completion_ids)
        )
        assert int(mask(sample.loss_mask).sum()) == sum(
            len(tokens(c.completion_ids)) for c in calls
        )
        three_turns += len(calls) == 3
    assert three_turns >= 1
