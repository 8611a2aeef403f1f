"""Harbor task folders as an rlbus environment: `harbor:PATH`.

A Harbor user brings the folders they already have, unchanged: PATH is one task folder (it holds
task.toml, instruction.md, the environment folder with its Dockerfile or task.toml's
`[environment] docker_image`, the tests folder with test.sh, and optionally the solution folder
with solve.sh) or a folder of them (a dataset). `rlbus eval harbor:PATH --harness command ...`
evaluates it; in an env.toml,
`taskset = "harbor:PATH"` (PATH relative to the env.toml) with `[env.harness]` choosing the
agent. Harbor's task says nothing about the agent, so the harness is the user's choice: the
command harness with any program (`harness.command`), or an agent preset.

Each task folder is one task: its prompt is instruction.md; its info["harbor"] holds the folder
(`task_dir`), its `name` and task.toml's `metadata`. A rollout runs as a Harbor trial does:
- before the agent: the rollout's working directory stands for the image's WORKDIR (mounted
  there, so /app paths work) with the files the Dockerfile COPYs from the environment folder;
  every task's tests and solution folders are hidden from the agent (an empty directory over
  each), whatever else of the host it may read;
- after the agent, in the same sandbox: TASK/tests is mounted at /tests, a fresh folder at
  /logs, and `bash /tests/test.sh` runs (no network, [verifier] timeout_sec); the reward it
  wrote (/logs/verifier/reward.json, else reward.txt, as Harbor reads them) goes to
  state["harbor"] = {"reward", "metrics" (reward.json's other numbers), "test_exit_code",
  "test_output"}. A test.sh that writes no usable reward makes the rollout an error of kind
  "verifier" naming why, with its output: Harbor fails such a trial too (RewardFileNotFoundError)
  rather than scoring it 0;
- the task set's reward `reward` (weight 1) is that number; reward.json's other keys become
  metrics when named in `[env.args] metrics = [...]`, and stay in state either way.

Where it runs: the sandbox runtime (bubblewrap) by default, for tasks whose Dockerfile only
names a plain python/ubuntu/debian base, sets WORKDIR and COPYs files: the host's own userland
stands in for the image. A task that needs its image (task.toml docker_image) runs with
runtime.kind = "docker" on a machine with a Docker engine; without an engine it is refused when
the environment loads, by name. rlbus builds no images: a Dockerfile that does more (RUN, ENV,
...) is refused with the `docker build` to run first. In the docker runtime every program is its
own `docker run --rm` with a read-only root: the agent's work persists only in its working
directory (the image's WORKDIR content is copied into it first).

`[env.args]`: `tasks` / `exclude` (name globs, as harbor's --task-name / --exclude-task-name),
`oracle = true` (solution/ mounted at /solution for the agent: `bash /solution/solve.sh` is
Harbor's oracle agent, to check that tasks and tests agree), `metrics` (reward.json keys).
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import posixpath
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from rlbus.config import ConfigError
from rlbus.environment.decorators import reward
from rlbus.environment.docker_engine import docker_problem
from rlbus.environment.harbor_tasks import (
    HarborTask,
    RewardFileError,
    read_folder,
    read_reward,
)
from rlbus.environment.rules import Rule, Rules, discover
from rlbus.environment.taskset import RolloutHookError, TaskSet

PREFIX = "harbor:"
LOGS = "/logs"
TESTS = "/tests"
SOLUTION = "/solution"
HIDDEN = ("tests", "solution")
"""A task folder's parts the agent never sees."""
OUTPUT_TAIL = 2000
"""Characters of test.sh's output kept in the rollout's state."""


docker_engine_problem = functools.cache(docker_problem)
"""Asked once per process: every task set that needs an image asks it when it loads."""


def _selected(tasks: list[HarborTask], keep: list[str] | None, exclude: list[str]) -> list[str]:
    names = [t.name for t in tasks]
    if keep is not None:
        names = [n for n in names if any(fnmatch.fnmatch(n, g) for g in keep)]
    return [n for n in names if not any(fnmatch.fnmatch(n, g) for g in exclude)]


def _leave_out(name: str) -> str:
    return f'or leave the task out with [env.args] exclude = ["{name}"]'


class HarborTaskSet(TaskSet):
    """Base of the task set made for each `harbor:PATH` (see `harbor_taskset_class`)."""

    root: ClassVar[Path] = Path()
    defaults: dict[str, Any] = {"harness": {"kind": "command"}, "runtime": {"kind": "sandbox"}}

    def __init__(
        self,
        tasks: list[str] | None = None,
        exclude: list[str] | None = None,
        oracle: bool = False,
        metrics: list[str] | None = None,
    ):
        super().__init__(tasks=tasks, exclude=exclude, oracle=oracle, metrics=metrics)
        found = read_folder(self.root)
        names = _selected(found, tasks, exclude or [])
        if not names:
            raise ConfigError(f"harbor:{self.root}: [env.args] tasks/exclude leave no task")
        self.tasks = {t.name: t for t in found if t.name in names}
        self.hidden = [t.directory / part for t in found for part in HIDDEN]
        self.oracle = oracle
        self.metric_names = list(metrics or [])
        if "reward" in self.metric_names:
            raise ConfigError(f"harbor:{self.root}: metrics names 'reward', which is the reward")
        self.defaults = self._defaults()

    def _defaults(self) -> dict[str, Any]:
        """Harness and runtime settings the tasks ask for; env.toml and the CLI still win."""
        tasks = list(self.tasks.values())
        runtime: dict[str, Any] = {
            "kind": "sandbox",
            # One program run is the whole agent, or the whole verifier.
            "timeout_s": max(max(t.agent_timeout_s, t.verifier_timeout_s) for t in tasks),
        }
        if cpus := [t.cpus for t in tasks if t.cpus is not None]:
            runtime["cpus"] = max(cpus)
        if memory := [t.memory_mb for t in tasks if t.memory_mb is not None]:
            runtime["memory_mb"] = max(memory)
        if images := self._images(tasks):
            runtime.update(kind="docker", image=images[0])
        harness = {"kind": "command", "timeout_s": max(t.agent_timeout_s for t in tasks)}
        return {"harness": harness, "runtime": runtime}

    def _images(self, tasks: list[HarborTask]) -> list[str]:
        """The one image the container tasks run in; ConfigError naming the tasks that cannot
        run here, and what to do."""
        needing = [t for t in tasks if t.container]
        if not needing:
            return []
        built = [t for t in needing if not t.image]
        if built:
            task = built[0]
            raise ConfigError(
                f"harbor:{self.root} task {task.name} needs {task.container}; rlbus builds no "
                f"images: build it (docker build -t {task.name} {task.directory}/environment), "
                f'set docker_image = "{task.name}" under [environment] in its task.toml and run '
                f'with runtime.kind = "docker" on a machine with a Docker engine, '
                f"{_leave_out(task.name)}"
            )
        problem = docker_engine_problem()
        if problem is not None:
            task = needing[0]
            more = f" (and {len(needing) - 1} more task(s))" if len(needing) > 1 else ""
            raise ConfigError(
                f"harbor:{self.root} task {task.name}{more} needs {task.container}; set "
                f'runtime.kind = "docker" on a machine with a Docker engine (here: {problem}), '
                f"{_leave_out(task.name)}"
            )
        images = sorted({t.image for t in needing if t.image})
        if len(images) > 1:
            raise ConfigError(
                f"harbor:{self.root}: its tasks need {len(images)} images ({', '.join(images)}); "
                "the docker runtime runs one image (runtime.image): run the tasks of each image "
                "as an environment of its own ([env.args] tasks = [...])"
            )
        return images

    def rows(self) -> Iterator[dict[str, Any]]:
        for task in self.tasks.values():
            info = {
                "task_dir": str(task.directory),
                "name": task.name,
                "metadata": task.metadata,
            }
            yield {"task_id": task.name, "prompt": task.instruction, "info": {"harbor": info}}

    def _task(self, rollout: Any) -> HarborTask:
        name = rollout.task.info.get("harbor", {}).get("name")
        task = self.tasks.get(name)
        if task is None:
            raise RolloutHookError(
                "config", f"task {rollout.task.task_id} names no harbor task of harbor:{self.root}"
            )
        return task

    async def prepare_rollout(self, rollout: Any) -> None:
        """The agent's starting point: the image's WORKDIR as its working directory, with the
        files the Dockerfile copies; tests and solutions hidden (solution at /solution for the
        oracle)."""
        task, sandbox = self._task(rollout), rollout.sandbox
        kind = rollout.env.config.runtime.kind
        if task.container and kind != "docker":
            raise RolloutHookError(
                "config",
                f"harbor task {task.name} needs {task.container}, and this environment runs "
                f'runtime.kind = "{kind}": set runtime.kind = "docker" on a machine with a Docker '
                "engine",
            )
        if task.image and rollout.env.config.runtime.image != task.image:
            raise RolloutHookError(
                "config",
                f"harbor task {task.name} needs the image {task.image}; runtime.image is "
                f"{rollout.env.config.runtime.image}",
            )
        if kind in ("local", "subprocess"):
            raise RolloutHookError(
                "config",
                f"harbor task {task.name}: the {kind} runtime would show the agent the task's "
                'tests and solution; use runtime.kind = "sandbox" (or "docker")',
            )
        if task.container and task.workdir:
            # The image's WORKDIR, copied where the agent's work persists between programs.
            copied = await sandbox.run(
                ["sh", "-c", 'if [ -d "$1" ]; then cp -a "$1"/. .; fi', "sh", task.workdir], {}
            )
            if copied.error_kind:
                raise RolloutHookError(
                    "environment",
                    f"harbor task {task.name}: copying the image's {task.workdir}: {copied.error}",
                )
        elif task.dockerfile is not None:
            self._copy_files(task, sandbox.workdir)
        if task.workdir:
            sandbox.mount(task.workdir, sandbox.workdir, writable=True)
        if kind != "docker":  # a container sees no host path but its working directory
            for path in self.hidden:
                if path.exists():
                    sandbox.mount(str(path))
        if self.oracle and (task.directory / "solution").is_dir():
            sandbox.mount(SOLUTION, task.directory / "solution")

    def _copy_files(self, task: HarborTask, workdir: Path) -> None:
        """What the Dockerfile COPYs from the environment folder, placed as the image would
        have it under its WORKDIR (which `workdir` stands for)."""
        if task.dockerfile is None or task.workdir is None:
            return  # no COPY without a WORKDIR reaches here: read_dockerfile sends it to docker
        context = (task.directory / "environment").resolve()
        for copy in task.dockerfile.copies:
            target = workdir / Path(copy.destination).relative_to(task.workdir)
            for pattern in copy.sources:
                pattern = posixpath.normpath(pattern)
                sources = [context] if pattern == "." else sorted(context.glob(pattern))
                if not sources:
                    raise RolloutHookError(
                        "environment",
                        f"harbor task {task.name}: its Dockerfile copies {pattern}, which is not "
                        f"in {context}",
                    )
                for source in sources:
                    if not source.resolve().is_relative_to(context):
                        raise RolloutHookError(
                            "environment",
                            f"harbor task {task.name}: COPY {pattern} leaves the build context",
                        )
                    if source.is_dir():  # a folder's contents, as COPY does
                        shutil.copytree(source, target, dirs_exist_ok=True)
                        continue
                    into = copy.into or target.is_dir()
                    placed = target / source.name if into else target
                    placed.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, placed)

    async def check_rollout(self, rollout: Any) -> None:
        """The task's verifier in the agent's sandbox: tests at /tests, a fresh /logs, then
        `bash /tests/test.sh`; its reward into state["harbor"]."""
        task, sandbox = self._task(rollout), rollout.sandbox
        verifier = f"{task.directory}/tests/test.sh"
        logs = Path(tempfile.mkdtemp(prefix="rlbus-harbor-logs-"))
        try:
            for part in ("verifier", "agent"):
                (logs / part).mkdir()
            sandbox.mount(LOGS, logs, writable=True)
            sandbox.mount(TESTS, task.directory / "tests")
            try:
                async with asyncio.timeout(task.verifier_timeout_s):
                    result = await sandbox.run(["bash", f"{TESTS}/test.sh"], {})
            except TimeoutError:
                raise RolloutHookError(
                    "timeout",
                    f"harbor task {task.name}: {verifier} ran past [verifier] timeout_sec = "
                    f"{task.verifier_timeout_s:g}s",
                ) from None
            output = (result.stdout + result.stderr)[-OUTPUT_TAIL:]
            found: dict[str, Any] = {"test_exit_code": result.returncode, "test_output": output}
            rollout.state["harbor"] = found
            try:
                found.update(read_reward(logs / "verifier"))
            except RewardFileError as exc:
                # Its exit status says little (Harbor ignores it); a limit it hit says why.
                ran = result.error if result.error_kind not in ("", "exit") else None
                ran = ran or f"exit {result.returncode}"
                raise RolloutHookError(
                    "verifier",
                    f"harbor task {task.name}: {verifier} left no reward: {exc} ({ran}); "
                    f"its output ends:\n{output[-1000:]}",
                ) from None
        finally:
            shutil.rmtree(logs, ignore_errors=True)

    @reward(weight=1.0, name="reward")
    def verifier_reward(self, state: dict[str, Any]) -> float:
        """The reward the task's test.sh wrote."""
        return state["harbor"]["reward"]

    def adapted_rules(self) -> Rules:
        """The tagged reward, plus a metric per reward.json key named in [env.args] metrics."""
        rules = discover(self)
        rules.metrics += [_metric(name) for name in self.metric_names]
        return rules


def _metric(key: str) -> Rule:
    def value(state: dict[str, Any]) -> float:
        metrics = state["harbor"].get("metrics", {})
        if key not in metrics:
            raise KeyError(f"reward.json has no number {key!r} (numbers: {sorted(metrics)})")
        return metrics[key]

    return Rule(key, "metric", 0.0, value, ("state",))


@functools.cache
def _class(root: Path) -> type[HarborTaskSet]:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", root.name) or "harbor"
    return type(f"Harbor_{name}", (HarborTaskSet,), {"name": name, "root": root})


def harbor_taskset_class(path: str) -> tuple[type[TaskSet], str]:
    """The task set of `harbor:PATH` (PATH absolute, or relative to this process's directory),
    and the reference resolved; one class per folder, so loading twice gives the same."""
    if not path:
        raise ConfigError("harbor: names no folder (give harbor:PATH, a Harbor task folder)")
    root = Path(path).resolve()
    read_folder(root)  # a wrong path fails here, naming it
    return _class(root), f"{PREFIX}{root}"
