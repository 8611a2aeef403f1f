"""Harbor task folders (`harbor:PATH`, environment/harbor.py) run for real: the task folders of
examples/harbor as Harbor lays them out, agents as command-harness programs in the bubblewrap
sandbox, each task's own test.sh as the verifier in the agent's sandbox, a scripted model over
HTTP behind the interception server, and (for `rlbus eval`) the embedded broker and a sink into
chdb.

A verifier that leaves no usable reward makes the rollout an error of kind "verifier", with the
reason and the end of test.sh's output, as Harbor fails such a trial (RewardFileNotFoundError);
it is never scored 0.

Without a working bubblewrap the rollout tests are skipped, naming it, except under CI=true,
where they fail."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ScriptedModel, ScriptedServer
from support.isolated import isolated_settings, running_sink

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.config import ConfigError, Settings
from rlbus.environment import Environment, RuntimeConfig, Scorer, load_environment
from rlbus.environment import harbor as harbor_module
from rlbus.environment.harbor_tasks import read_dockerfile
from rlbus.launch.eval import run_eval
from rlbus.producers.interception import EvalBackend, InterceptionServer
from rlbus.producers.rollouts import RolloutOutput, RolloutRunner
from rlbus.producers.runtimes import DockerRuntime, Mount, make_runtime, sandbox_problem
from rlbus.schemas import RolloutScored

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"
SANDBOX_TASKS = ["hello-file", "fix-function"]
IMAGE = "ghcr.io/rlbus-examples/harbor-hello-rust:1.0"
"""custom-image's task.toml docker_image."""
IDLE = ["true"]
"""An agent that does nothing."""
ORACLE = {"args": {"oracle": True}, "harness": {"command": ["bash", "/solution/solve.sh"]}}
"""Harbor's oracle agent: the task's own solve.sh, mounted at /solution for it alone."""


@pytest.fixture
def bubblewrap() -> None:
    problem = sandbox_problem()
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI runs the Harbor tasks in the bubblewrap sandbox, and here: {problem}")
    pytest.skip(f"Harbor tasks run in the bubblewrap sandbox, which cannot run here: {problem}")


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedServer]:
    # A model that always answers the hello-file task's line.
    with ScriptedServer(ScriptedModel(chat=lambda m, t: {"content": "Hello, world!"})) as server:
        yield server


def model_overrides(upstream: ScriptedServer, **overrides: Any) -> dict[str, Any]:
    return {"model": {"name": "scripted", "base_url": f"{upstream.url}/v1"}, **overrides}


def dataset(tmp_path: Path, *names: str) -> Path:
    """A copy of example task folders, to change or to add to."""
    root = tmp_path / "tasks"
    for name in names:
        shutil.copytree(EXAMPLES / name, root / name)
    return root


def task_folder(root: Path, name: str, test_sh: str, toml: str = "") -> Path:
    """A minimal Harbor task: plain python base, the given test.sh."""
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text(f'version = "1.0"\n{toml}')
    (folder / "instruction.md").write_text("Do nothing.\n")
    (folder / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (folder / "tests" / "test.sh").write_text(textwrap.dedent(test_sh))
    return folder


async def rollouts(env: Environment) -> list[RolloutOutput]:
    """One rollout of each of the environment's tasks, at once."""
    async with InterceptionServer(EvalBackend(env.config.model), env.config.sampling) as server:
        runner = RolloutRunner(env, server)
        tasks = list(env.tasks("r"))
        return list(await asyncio.gather(*(runner.run(t, f"g-{t.task_id}", 0, 1) for t in tasks)))


def run(
    spec: str, upstream: ScriptedServer, **overrides: Any
) -> tuple[Environment, dict[str, RolloutOutput]]:
    env = load_environment(spec, model_overrides(upstream, **overrides))
    outs = asyncio.run(rollouts(env))
    return env, {o.rollout.task_id: o for o in outs}


def scored(env: Environment, out: RolloutOutput) -> RolloutScored:
    assert out.rollout.status == "ok", out.rollout.error
    (score,) = asyncio.run(Scorer(env).score([out.rollout]))
    assert score.status == "ok", score.error
    return score


def harbor_state(out: RolloutOutput) -> dict[str, Any]:
    return out.rollout.info["state"]["harbor"]


# `rlbus eval` end to end --------------------------------------------------------------------


@pytest.fixture(scope="module")
def settings(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    root = tmp_path_factory.mktemp("harbor")
    settings = isolated_settings(broker, root, flush_interval_s=0.1)
    with running_sink(settings, root / "logs"):
        yield settings


MODEL_AGENT = """
import json, os, urllib.request
task = json.load(open(os.environ["RLBUS_TASK_FILE"]))
body = {"model": os.environ["RLBUS_MODEL"], "messages": task["messages"]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
    {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
answer = json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"]
open("/app/hello.txt", "w").write(answer + "\\n")
"""


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        ("oracle", {"hello-file": 1.0, "fix-function": 1.0}),
        ("idle", {"hello-file": 0.0, "fix-function": 0.0}),
        ("model", {"hello-file": 1.0, "fix-function": 0.0}),
    ],
)
def test_eval_rewards_come_from_each_tasks_test_sh(
    bubblewrap: None,
    settings: Settings,
    upstream: ScriptedServer,
    tmp_path: Path,
    agent: str,
    expected: dict[str, float],
) -> None:
    """The oracle (solve.sh) scores 1 on every task, an agent that does nothing 0, and an agent
    that writes the model's answer 1 on the task that answer solves; every score is test.sh's,
    stored with the rollout's verifier state."""
    (tmp_path / "agent.py").write_text(MODEL_AGENT)
    harness = {
        "oracle": ORACLE,
        "idle": {"harness": {"command": IDLE}},
        "model": {"harness": {"command": ["{python}", str(tmp_path / "agent.py")]}},
    }[agent]
    overrides = model_overrides(upstream, group_size=2, **harness)
    overrides["args"] = {**overrides.get("args", {}), "exclude": ["custom-image"]}
    overrides["runtime"] = {"read_only": [str(tmp_path)]}  # where the model agent's program is
    env = load_environment(f"harbor:{EXAMPLES}", overrides)
    result = run_eval(
        env, settings, n=2, run_id=f"harbor-{uuid.uuid4().hex[:8]}", show_progress=False
    )
    assert (result.tally.rollouts, result.tally.errors) == (4, 0)
    with open_store(settings.store.url, read_only=True) as store:
        rows = store.query(
            "SELECT r.task_id, s.reward, r.info FROM scored AS s FINAL "
            "INNER JOIN (SELECT * FROM rollouts FINAL WHERE run_id = {run:String}) AS r "
            "USING rollout_id WHERE s.run_id = {run:String}",
            {"run": result.run_id},
        ).rows
        calls = store.query(
            "SELECT count() FROM trace_nodes FINAL WHERE run_id = {run:String} AND sampled",
            {"run": result.run_id},
        ).rows[0][0]
    assert sorted((task, reward) for task, reward, _ in rows) == sorted(
        (task, reward) for task, reward in expected.items() for _ in range(2)
    )
    for task, reward, info in rows:
        state = json.loads(info)["state"]["harbor"]
        assert state["reward"] == reward and state["test_exit_code"] == 0
        if task == "fix-function":  # its check_median.py printed each case
            assert ("FAIL" in state["test_output"]) == (reward == 0.0)
    assert calls == (4 if agent == "model" else 0)  # the model agent's calls were recorded


# reward.json ---------------------------------------------------------------------------------


@pytest.mark.slow  # runs agents and verifiers in bubblewrap
def test_reward_json_keys_become_metrics_when_named(
    bubblewrap: None, upstream: ScriptedServer
) -> None:
    for agent, passed in ((ORACLE, 5.0), ({"harness": {"command": IDLE}}, 3.0)):
        args = {**agent.get("args", {}), "metrics": ["passed", "failed"]}
        env, outs = run(f"harbor:{EXAMPLES}/fix-function", upstream, **{**agent, "args": args})
        out = outs["fix-function"]
        score = scored(env, out)
        assert score.rewards == {"reward": float(passed == 5.0)}
        assert score.metrics == {"passed": passed, "failed": 5.0 - passed}
        assert harbor_state(out)["metrics"] == {"passed": passed, "failed": 5.0 - passed}
    # Unnamed, they stay in the rollout's state only.
    env, outs = run(f"harbor:{EXAMPLES}/fix-function", upstream, **ORACLE)
    assert scored(env, outs["fix-function"]).metrics == {}
    assert harbor_state(outs["fix-function"])["metrics"] == {"passed": 5.0, "failed": 0.0}


# A verifier that leaves no reward ------------------------------------------------------------


@pytest.mark.slow  # runs agents and verifiers in bubblewrap
def test_a_verifier_without_a_usable_reward_errors_the_rollout_with_the_reason(
    bubblewrap: None, upstream: ScriptedServer, tmp_path: Path
) -> None:
    root = tmp_path / "tasks"
    task_folder(root, "crashes", 'echo "pytest: command not found" >&2\nexit 127\n')
    task_folder(root, "garbled", "echo 'all good' > /logs/verifier/reward.txt\n")
    task_folder(root, "no-key", 'echo \'{"score": 1, "time": 2}\' > /logs/verifier/reward.json\n')
    task_folder(
        root,
        "slow",
        "sleep 30\n",
        toml="[verifier]\ntimeout_sec = 1.0\n",
    )
    task_folder(root, "exits-1-with-a-reward", "echo 0.5 > /logs/verifier/reward.txt\nexit 1\n")
    env, outs = run(f"harbor:{root}", upstream, harness={"command": IDLE})
    errors = {
        name: (o.rollout.error_kind, o.rollout.error)
        for name, o in outs.items()
        if o.rollout.status == "error"
    }
    assert set(errors) == {"crashes", "garbled", "no-key", "slow"}
    kind, error = errors["crashes"]
    assert kind == "verifier" and "harbor task crashes" in error
    assert "wrote neither /logs/verifier/reward.json nor reward.txt" in error
    assert "exit 127" in error and "pytest: command not found" in error
    assert harbor_state(outs["crashes"])["test_exit_code"] == 127  # kept with the rollout
    assert errors["garbled"][0] == "verifier" and "'all good', not a number" in errors["garbled"][1]
    assert "no 'reward' key (keys: ['score', 'time'])" in errors["no-key"][1]
    assert errors["slow"] == (
        "timeout",
        f"harbor task slow: {root}/slow/tests/test.sh ran past [verifier] timeout_sec = 1s",
    )
    # Harbor reads the reward whatever test.sh's exit status.
    assert scored(env, outs["exits-1-with-a-reward"]).reward == 0.5


# Containers ----------------------------------------------------------------------------------


def test_a_task_needing_its_image_is_refused_by_name_without_a_docker_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harbor_module, "docker_engine_problem", lambda: "no docker CLI on PATH")
    for overrides in ({}, {"runtime": {"kind": "docker"}}):
        with pytest.raises(ConfigError) as refused:
            load_environment(f"harbor:{EXAMPLES}", overrides)
        assert str(refused.value) == (
            f"harbor:{EXAMPLES} task custom-image needs the container image "
            "ghcr.io/rlbus-examples/harbor-hello-rust:1.0 (task.toml [environment] "
            'docker_image); set runtime.kind = "docker" on a machine with a Docker engine '
            "(here: no docker CLI on PATH), or leave the task out with [env.args] exclude = "
            '["custom-image"]'
        )
    # Left out, the rest loads (into the sandbox).
    env = load_environment(f"harbor:{EXAMPLES}", {"args": {"exclude": ["custom-image"]}})
    assert sorted(t.task_id for t in env.tasks()) == sorted(SANDBOX_TASKS)
    assert env.config.runtime.kind == "sandbox"


def test_with_an_engine_its_image_is_the_runtimes_and_another_runtime_refuses_the_rollout(
    bubblewrap: None, monkeypatch: pytest.MonkeyPatch, upstream: ScriptedServer, tmp_path: Path
) -> None:
    """No Docker engine here: its answer is stood in for, and the rollout that would need it is
    refused before the agent runs."""
    monkeypatch.setattr(harbor_module, "docker_engine_problem", lambda: None)
    spec = f"harbor:{EXAMPLES}/custom-image"
    env = load_environment(spec)
    runtime = env.config.runtime
    assert (runtime.kind, runtime.image) == ("docker", IMAGE)
    assert (runtime.cpus, runtime.memory_mb, runtime.timeout_s) == (2.0, 4096, 600.0)
    marker = tmp_path / "agent-ran"
    _, outs = run(
        spec,
        upstream,
        runtime={"kind": "sandbox"},
        harness={"command": ["touch", str(marker)]},
    )
    out = outs["custom-image"]
    assert out.rollout.error_kind == "config" and out.rollout.error == (
        "harbor task custom-image needs the container image "
        "ghcr.io/rlbus-examples/harbor-hello-rust:1.0 (task.toml [environment] docker_image), "
        'and this environment runs runtime.kind = "sandbox": set runtime.kind = "docker" on a '
        "machine with a Docker engine"
    )
    assert not marker.exists()


def test_a_dockerfile_that_builds_is_refused_with_the_build_to_run(tmp_path: Path) -> None:
    root = tmp_path / "tasks"
    folder = task_folder(root, "needs-tools", "true\n")
    (folder / "environment" / "Dockerfile").write_text(
        "FROM python:3.12-slim\nWORKDIR /app\n"
        "RUN apt-get update && \\\n    apt-get install -y tmux\n"
    )
    with pytest.raises(ConfigError) as refused:
        load_environment(f"harbor:{root}")
    message = str(refused.value)
    assert message.startswith(
        f"harbor:{root} task needs-tools needs an image built from {folder}/environment/"
        "Dockerfile (line 3: RUN apt-get update && apt-get install -y tmux)"
    )
    assert f"docker build -t needs-tools {folder}/environment" in message
    assert 'docker_image = "needs-tools" under [environment]' in message


@pytest.mark.parametrize(
    ("text", "workdir", "beyond"),
    [
        ("FROM python:3.12-slim\nWORKDIR /app\nCOPY a.py b/ /app/src/\n", "/app", None),
        ("# syntax\nFROM docker.io/library/ubuntu:24.04\nWORKDIR /srv\nLABEL x=y\n", "/srv", None),
        ("FROM python:3.12\nWORKDIR /app\nWORKDIR sub\nCOPY . .\n", "/app/sub", None),
        ("FROM node:20\nWORKDIR /app\n", "/app", "line 1: FROM node:20 (not a plain"),
        ("FROM python:3.12\nENV A=1\n", None, "line 2: ENV A=1"),
        ("FROM python:3.12\nCOPY x /x\n", None, "COPY to /x, outside the WORKDIR"),
        ("FROM python:3.12 AS b\nFROM python:3.12\n", None, "line 2: FROM python:3.12 (a multi"),
        ("FROM python:3.12\nWORKDIR /app\nCOPY --from=b /x .\n", "/app", "line 3: COPY --from"),
    ],
)
def test_which_dockerfiles_the_sandbox_stands_in_for(
    tmp_path: Path, text: str, workdir: str | None, beyond: str | None
) -> None:
    (tmp_path / "Dockerfile").write_text(text)
    read = read_dockerfile(tmp_path / "Dockerfile")
    assert read.workdir == workdir
    assert (read.beyond_sandbox or "").startswith(beyond or "") and (
        (read.beyond_sandbox is None) == (beyond is None)
    )


# What the agent sees -------------------------------------------------------------------------

SNOOP = """
import json, os, sys
task = json.load(open(os.environ["RLBUS_TASK_FILE"]))["info"]["harbor"]
own, root = task["task_dir"], os.path.dirname(task["task_dir"])
def seen(path):
    try:
        return sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()[:40]
    except OSError as exc:
        return type(exc).__name__
paths = {
    "own tests": own + "/tests", "own test.sh": own + "/tests/test.sh",
    "own solution": own + "/solution", "own solve.sh": own + "/solution/solve.sh",
    "other tests": root + "/hello-file/tests/test.sh", "/tests": "/tests",
    "/solution": "/solution", "/logs": "/logs", "instruction": own + "/instruction.md",
    "app": "/app", "cwd": os.getcwd(),
}
print(json.dumps({name: seen(path) for name, path in paths.items()}))
"""


@pytest.mark.slow  # runs agents and verifiers in bubblewrap
@pytest.mark.parametrize("oracle", [False, True])
def test_the_agent_sees_neither_tests_nor_solutions(
    bubblewrap: None, upstream: ScriptedServer, tmp_path: Path, oracle: bool
) -> None:
    """The env.toml sits in the dataset's folder, so the agent may read that folder (its
    {env_dir}): still no task's tests or solution, until the verifier gets /tests. The oracle
    alone gets its own task's solution, at /solution."""
    root = dataset(tmp_path, *SANDBOX_TASKS)
    (root / "snoop.py").write_text(SNOOP)
    (root / "env.toml").write_text(
        textwrap.dedent(f"""
        [env]
        taskset = "harbor:."
        [env.args]
        oracle = {str(oracle).lower()}
        [env.harness]
        command = ["{{python}}", "{{env_dir}}/snoop.py"]
        """)
    )
    env, outs = run(str(root), upstream)
    out = outs["fix-function"]
    seen = json.loads(out.rollout.info["state"]["stdout"])
    for name in ("own tests", "own solution"):
        assert seen[name] == [], seen  # an empty directory over each
    for name in ("own test.sh", "own solve.sh", "other tests", "/tests", "/logs"):
        assert seen[name] == "FileNotFoundError", (name, seen)
    assert seen["instruction"].startswith("`/app/mathlib.py` defines")  # the folder is readable
    assert seen["app"] == sorted(["mathlib.py", "task.json", ".state"])  # the Dockerfile's COPY
    assert seen["/solution"] == (["solve.sh"] if oracle else "FileNotFoundError")
    assert scored(env, out).reward == 0.0  # the verifier still saw /tests


def test_runtimes_without_mounts_refuse_harbor_rollouts(
    upstream: ScriptedServer, tmp_path: Path
) -> None:
    """The subprocess and local runtimes would show the agent every task's tests."""
    marker = tmp_path / "agent-ran"
    for kind in ("subprocess", "local"):
        _, outs = run(
            f"harbor:{EXAMPLES}/hello-file",
            upstream,
            runtime={"kind": kind},
            harness={"command": ["touch", str(marker)]},
        )
        out = outs["hello-file"]
        assert out.rollout.error_kind == "config" and out.rollout.error == (
            f"harbor task hello-file: the {kind} runtime would show the agent the task's tests "
            'and solution; use runtime.kind = "sandbox" (or "docker")'
        )
    assert not marker.exists()


# Finding the folders -------------------------------------------------------------------------


def test_relative_paths_resolve_against_the_env_toml_else_this_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = dataset(tmp_path, "hello-file")
    (tmp_path / "env.toml").write_text('[env]\ntaskset = "harbor:tasks/hello-file"\n')
    monkeypatch.chdir(root)
    from_toml = load_environment(str(tmp_path / "env.toml"))
    from_cwd = load_environment("harbor:hello-file")
    assert from_toml.config.taskset == from_cwd.config.taskset == f"harbor:{root / 'hello-file'}"
    assert from_cwd.spec == f"harbor:{root / 'hello-file'}"  # another process loads the same
    assert from_cwd.id == "hello-file" and from_cwd.config.harness.kind == "command"
    (task,) = from_cwd.tasks()
    assert task.prompt == "Create a file `/app/hello.txt` whose only line is `Hello, world!`.\n"
    assert task.info["harbor"] == {
        "task_dir": str(root / "hello-file"),
        "name": "hello-file",
        "metadata": {
            "author_name": "rlbus examples",
            "difficulty": "easy",
            "category": "file-operations",
            "tags": ["trivial"],
        },
    }
    with pytest.raises(ConfigError, match="is neither a Harbor task folder"):
        load_environment(f"harbor:{tmp_path}")
    with pytest.raises(ConfigError, match="no such folder"):
        load_environment("harbor:nowhere")


def test_the_docker_runtime_passes_the_mounts(tmp_path: Path) -> None:
    """No Docker engine here: the `docker run` argv is checked, not run."""
    runtime = make_runtime(RuntimeConfig(kind="docker", image=IMAGE))
    assert isinstance(runtime, DockerRuntime)
    mounts = [
        Mount("/app", tmp_path, writable=True),
        Mount("/tests", tmp_path / "tests"),
        Mount("/hidden"),
    ]
    argv, _ = runtime.command("rlbus-x", tmp_path, ["bash", "/tests/test.sh"], {}, None, mounts)
    line = " ".join(argv)
    assert f"-v {tmp_path}:/app -v {tmp_path}/tests:/tests:ro --tmpfs /hidden:ro" in line
    assert line.endswith(f"{IMAGE} bash /tests/test.sh")
