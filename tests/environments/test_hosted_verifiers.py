"""verifiers V1 task sets hosted in a venv of their own (`rlbus env install`, then
`verifiers:NAME`), for real: examples/verifiers_v1/reverse_text installed by rlbus's installer
with verifiers 0.4 from the registry, its worker (environment/hosted/host.py) run by that venv's
python, a scripted model over HTTP behind rlbus's interception server, and for `rlbus eval` the
embedded broker and a sink into chdb.

Bad environments are modules installed into the same venv (as a package would be): one that
fails to import, one whose task raises, one that kills its worker, one that hangs it, one that
scores in a runtime (which mode "steps" cannot play). Installing
needs the registry; under CI=true a failed install fails the module, elsewhere it skips naming
the failure."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ScriptedModel, ScriptedServer
from support.in_process import run_in_process
from support.isolated import isolated_settings, module_settings, running_sink
from support.runs import run_config

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.bus.waiting import wait_for
from rlbus.config import ConfigError, Settings
from rlbus.consumers.inference.model_init import init_model
from rlbus.environment import Environment, Scorer, load_environment
from rlbus.environment.hosted.venvs import EnvInstallError, install_env
from rlbus.launch.eval import run_eval
from rlbus.producers.interception import EvalBackend, InterceptionServer
from rlbus.producers.rollouts import RolloutOutput, RolloutRunner
from rlbus.schemas.chat import text_of

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("verifiers-v1-venv")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "verifiers_v1" / "reverse_text"

FAULTY = '''
"""Task 2 misbehaves as the task set's `mode` says: raise, exit (kills the worker), hang."""
import os, time
import verifiers.v1 as vf
from reverse_text import OneTurnHarness

__all__ = ["FaultyTaskset", "OneTurnHarness"]

class FaultyData(vf.TaskData):
    mode: str = "raise"

class FaultyTask(vf.Task[FaultyData]):
    @vf.reward(weight=1.0)
    async def done(self, trace: vf.Trace) -> float:
        if self.data.name == "task-2":
            mode = self.data.mode
            if mode == "raise":
                raise RuntimeError("task-2 cannot be scored")
            if mode == "exit":
                os._exit(3)
            if mode == "hang":
                time.sleep(600)  # blocks the worker's event loop: only a kill ends it
        return 1.0

class FaultyConfig(vf.TasksetConfig):
    mode: str = "raise"

class FaultyTaskset(vf.Taskset[FaultyTask, FaultyConfig]):
    def load(self):
        for i in range(5):
            data = FaultyData(name=f"task-{i}", prompt=f"Reverse the text: word{i}",
                              mode=self.config.mode)
            yield FaultyTask(data, self.config.task)
'''

PROBE = '''
"""Its one task's prompt lists the environment variables its worker sees."""
import json, os
import verifiers.v1 as vf
from reverse_text import OneTurnHarness

__all__ = ["ProbeTaskset", "OneTurnHarness"]

class ProbeTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        yield vf.Task(vf.TaskData(name="probe", prompt=json.dumps(sorted(os.environ))),
                      self.config.task)
'''


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The example installed by rlbus's installer, with the bad environments beside it."""
    root = tmp_path_factory.mktemp("hosted-v1")
    old = os.environ.get("RLBUS_ENVS_DIR")
    os.environ["RLBUS_ENVS_DIR"] = str(root / "envs")
    try:
        try:
            # From a copy: setuptools builds in the source folder, which others may be using.
            source = shutil.copytree(EXAMPLE, root / "src" / EXAMPLE.name)
            installed = install_env(root, str(source), say=lambda line: None)
        except EnvInstallError as exc:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI installs verifiers 0.4 from the registry, and here: {exc}")
            pytest.skip(f"verifiers 0.4 cannot be installed here: {exc}")
        site = next(Path(installed.path).glob("lib/python*/site-packages"))
        (site / "faulty_env.py").write_text(FAULTY)
        (site / "probe_env.py").write_text(PROBE)
        (site / "boxed_env.py").write_text(BOXED)
        (site / "broken_env.py").write_text("raise ImportError('broken_env needs numpy 0.1')\n")
        yield Path(installed.path)
    finally:
        if old is None:
            os.environ.pop("RLBUS_ENVS_DIR", None)
        else:
            os.environ["RLBUS_ENVS_DIR"] = old


def answer(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    """Reverses words of even length, and gets odd ones wrong (the word as it is): rewards that
    differ by task."""
    word = text_of(messages[-1].get("content")).split()[-1]
    return {"content": word[::-1] if len(word) % 2 == 0 else word}


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedModel(chat=answer)) as server:
        yield server


def overrides(upstream: ScriptedServer, **more: Any) -> dict[str, Any]:
    return {"model": {"name": "scripted", "base_url": f"{upstream.url}/v1"}, **more}


async def rollouts(env: Environment, n: int) -> list[RolloutOutput]:
    async with InterceptionServer(EvalBackend(env.config.model), env.config.sampling) as server:
        runner = RolloutRunner(env, server)
        tasks = list(env.tasks("r").take(n))
        return list(await asyncio.gather(*(runner.run(t, f"g-{t.task_id}", 0, 1) for t in tasks)))


def by_name(outs: list[RolloutOutput]) -> dict[str, RolloutOutput]:
    return {o.rollout.info["hosted"]["name"]: o for o in outs}


@pytest.fixture(scope="module")
def settings(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    root = tmp_path_factory.mktemp("hosted-v1-store")
    settings = isolated_settings(broker, root, flush_interval_s=0.1)
    with running_sink(settings, root / "logs"):
        yield settings


def verifiers_eval(venv: Path, upstream: ScriptedServer, n: int, out: Path) -> dict[str, float]:
    """verifiers' own `vf-eval` of the first n tasks, in the venv: reward by task prompt."""
    command = [
        *(str(venv / "bin" / "vf-eval"), "reverse_text", "--env.taskset.n", str(n)),
        *("-m", "scripted", "--client.base-url", f"{upstream.url}/v1"),
        *("--client.api-key-var", "OPENAI_API_KEY", "-n", str(n), "-r", "1"),
        *("--no-push", "--no-rich", "-o", str(out), "--env.agent.runtime.type", "subprocess"),
    ]
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "OPENAI_API_KEY": "x"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rewards = {}
    for path in out.glob("**/traces.jsonl"):
        for line in path.read_text().splitlines():
            episode = json.loads(line)
            (trace,) = episode["traces"]
            prompt = trace["task"]["data"]["prompt"]
            rewards[prompt] = sum(
                r["score"] * r["weight"] for r in trace["rewards"].values() if r is not None
            )
    return rewards


@pytest.mark.parametrize("mode", ["episode", "steps"])
def test_rlbus_eval_gives_verifiers_own_rewards_with_tokens_stored(
    venv: Path, upstream: ScriptedServer, settings: Settings, tmp_path: Path, mode: str
) -> None:
    """The same tasks, the same scripted model: `rlbus eval verifiers:reverse_text` stores, per
    task, the reward verifiers' own `vf-eval` gives; and each rollout's model call, recorded by
    rlbus's interception server, whether V1's own harness made it (episode) or rlbus's chat loop
    did, the task set's rewards scoring its answer (steps)."""
    n = 8
    theirs = verifiers_eval(venv, upstream, n, tmp_path / "vf")
    assert len(theirs) == n and len(set(theirs.values())) > 1, theirs
    env = load_environment(
        "verifiers:reverse_text", overrides(upstream, args={"mode": mode, "taskset": {"n": n}})
    )
    run_id = f"v1-{uuid.uuid4().hex[:8]}"
    result = run_eval(env, settings, n=n, run_id=run_id, show_progress=False)
    assert (result.tally.rollouts, result.tally.errors) == (n, 0)
    with open_store(settings.store.url, read_only=True) as store:
        rows = store.query(
            "SELECT r.prompt, s.reward FROM scored AS s FINAL INNER JOIN "
            "(SELECT * FROM rollouts FINAL WHERE run_id = {run:String}) AS r USING rollout_id "
            "WHERE s.run_id = {run:String}",
            {"run": run_id},
        ).rows
        calls = store.query(
            "SELECT count(), sum(prompt_tokens) FROM rollouts FINAL "
            "WHERE run_id = {run:String} AND num_turns = 1",
            {"run": run_id},
        ).rows[0]
        sampled = store.query(
            "SELECT count() FROM trace_nodes FINAL WHERE run_id = {run:String} AND sampled",
            {"run": run_id},
        ).rows[0][0]
    ours = {json.loads(p)[-1]["content"] if p.startswith("[") else p: r for p, r in rows}
    assert ours == pytest.approx(theirs)
    assert calls[0] == n and calls[1] > 0 and sampled == n


BOXED = '''
"""Its reward needs the task's runtime: only a V1 episode can score it."""
import verifiers.v1 as vf
from reverse_text import OneTurnHarness

__all__ = ["BoxedTaskset", "OneTurnHarness"]

class BoxedTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=1.0)
    async def checked(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        return 1.0

class BoxedTaskset(vf.Taskset[BoxedTask, vf.TasksetConfig]):
    def load(self):
        yield BoxedTask(vf.TaskData(name="boxed", prompt="Reverse the text: box"), self.config.task)
'''


def test_a_package_that_fails_to_import_is_an_error_naming_it(venv: Path, upstream: Any) -> None:
    env = load_environment(
        "verifiers:broken_env", overrides(upstream, args={"venv": "reverse-text"})
    )
    with pytest.raises(ConfigError, match=r"verifiers:broken_env.*broken_env needs numpy 0\.1"):
        list(env.tasks())
    env.taskset.worker.close()


def test_steps_mode_refuses_a_task_set_it_cannot_score_and_says_why(
    venv: Path, upstream: ScriptedServer
) -> None:
    args = {"venv": "reverse-text", "mode": "steps"}
    env = load_environment("verifiers:boxed_env", overrides(upstream, args=args))
    with pytest.raises(
        ConfigError, match=r"cannot run in mode 'steps'.*checked score in a runtime"
    ):
        list(env.tasks())
    env.taskset.worker.close()
    with pytest.raises(ConfigError, match=r"args.mode = 'turns'.*'episode' or 'steps'"):
        load_environment("verifiers:reverse_text", overrides(upstream, args={"mode": "turns"}))


def test_a_task_that_raises_is_stored_as_an_error_and_the_others_go_on(
    venv: Path, upstream: ScriptedServer
) -> None:
    args = {"venv": "reverse-text", "taskset": {"mode": "raise"}}
    env = load_environment("verifiers:faulty_env", overrides(upstream, args=args))
    outs = by_name(asyncio.run(rollouts(env, 5)))
    bad = outs.pop("task-2").rollout
    assert (bad.status, bad.error_kind) == ("error", "environment")
    assert "task-2 cannot be scored" in bad.error
    assert all(o.rollout.status == "ok" for o in outs.values())
    scores = asyncio.run(Scorer(env).score([o.rollout for o in outs.values()]))
    assert [s.reward for s in scores] == [1.0] * 4
    env.taskset.worker.close()


def test_a_worker_that_dies_fails_its_rollouts_with_the_reason_and_is_started_again(
    venv: Path, upstream: ScriptedServer
) -> None:
    args = {"venv": "reverse-text", "taskset": {"mode": "exit"}}
    env = load_environment("verifiers:faulty_env", overrides(upstream, args=args))
    worker = env.taskset.worker
    first = by_name(asyncio.run(rollouts(env, 5)))
    dead = first["task-2"].rollout
    assert dead.status == "error" and "worker exited with code 3" in dead.error
    assert "verifiers:faulty_env" in dead.error
    # The rollouts in flight with it failed the same way; a new worker serves the next ones.
    again = [o for n, o in by_name(asyncio.run(rollouts(env, 2))).items()]
    assert [o.rollout.status for o in again] == ["ok", "ok"]
    assert worker.pid is not None
    worker.close()


def test_a_hung_worker_is_killed_after_its_rollout_times_out(
    venv: Path, upstream: ScriptedServer
) -> None:
    args = {"venv": "reverse-text", "taskset": {"mode": "hang"}}
    more = {"args": args, "harness": {"timeout_s": 5}}
    env = load_environment("verifiers:faulty_env", overrides(upstream, **more))
    worker = env.taskset.worker
    outs = by_name(asyncio.run(rollouts(env, 3)))
    hung = outs["task-2"].rollout
    assert (hung.status, hung.error_kind) == ("error", "timeout")
    pid = worker.pid
    # Looked at the moment the worker is reported gone (no pause): it is gone from the process
    # table by then, not a zombie still being reaped.
    wait_for(lambda: worker.pid != pid, 30, "the hung worker to be killed", interval_s=0)
    assert pid is not None and not Path(f"/proc/{pid}").exists()
    # Started again for the next rollouts.
    assert [o.rollout.status for o in asyncio.run(rollouts(env, 2))] == ["ok", "ok"]
    worker.close()


def test_the_worker_sees_none_of_rlbus_settings_or_secrets(
    venv: Path, upstream: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("RLBUS_STORE__PASSWORD", "hunter2")
    env = load_environment(
        "verifiers:probe_env", overrides(upstream, args={"venv": "reverse-text"})
    )
    (task,) = env.tasks()
    seen = json.loads(
        text_of(task.prompt[-1]["content"]) if not isinstance(task.prompt, str) else task.prompt
    )
    assert "PATH" in seen
    assert not [name for name in seen if name.startswith("RLBUS_") or "API_KEY" in name], seen
    env.taskset.worker.close()


def test_not_installed_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLBUS_ENVS_DIR", str(tmp_path / "envs"))
    with pytest.raises(ConfigError, match=r"openenv:nothing_here.*rlbus env install"):
        load_environment("openenv:nothing_here")


def test_a_run_trains_on_a_v1_task_set_with_tokens_and_versions_stored(
    venv: Path, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """Two GRPO steps on `verifiers:reverse_text` (a tiny model, every role in this process, the
    real broker and chdb): each rollout played by V1's own harness through the interception
    server, and each one trained on stored with its token record and scored; each step's
    weights announced. (Rollouts still in flight when the run stops at max_steps need not be
    scored: the judge's group picks them up if the run resumes.)"""
    settings = module_settings(broker, tmp_path)
    base = tmp_path / "tiny"
    init_model(base, arch="llama", seed=0)
    cfg = run_config(settings, base, tmp_path, eval_every=0, drop_zero_signal=False)
    entry = cfg.envs["reverse_text"].model_copy(update={"path": "verifiers:reverse_text"})
    cfg = cfg.model_copy(update={"max_steps": 2, "envs": {"reverse_text": entry}})
    asyncio.run(run_in_process(cfg, EXAMPLES / "reverse_text", timeout_s=300))
    trained = (
        "SELECT DISTINCT JSONExtractString(sample, 'rollout_id') FROM batches FINAL "
        "ARRAY JOIN JSONExtractArrayRaw(samples) AS sample WHERE run_id = {r:String}"
    )
    with open_store(settings.store.url, read_only=True) as store:
        counts = store.query(
            "SELECT (SELECT count() FROM rollouts FINAL WHERE run_id = {r:String}), "
            "(SELECT countIf(status = 'error') FROM rollouts FINAL WHERE run_id = {r:String}), "
            f"(SELECT count() FROM ({trained})), "
            "(SELECT count() FROM rollouts FINAL WHERE run_id = {r:String} "
            f"AND rollout_id IN ({trained})), "
            "(SELECT uniqExact(rollout_id) FROM scored FINAL WHERE run_id = {r:String} "
            f"AND rollout_id IN ({trained})), "
            "(SELECT uniqExact(rollout_id) FROM tokens FINAL WHERE run_id = {r:String} "
            f"AND rollout_id IN ({trained})), "
            "(SELECT count() FROM weight_versions FINAL WHERE run_id = {r:String})",
            {"r": cfg.run_id},
        ).rows[0]
    rollouts, errors, trained_on, stored, scored, with_tokens, versions = counts
    assert rollouts >= 2 * 4 * 4 and errors == 0
    assert trained_on == 2 * 4 * 4
    assert stored == scored == with_tokens == trained_on
    assert versions >= 2
