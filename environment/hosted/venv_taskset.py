"""An environment hosted in a venv of its own (`rlbus env install`), as an rlbus task set.

`KIND:TARGET` names it: `verifiers:MODULE` (a verifiers V1 task set package), `openenv:PACKAGE`
(an OpenEnv environment package, its server started by the worker), `textarena:GAME` (a
TextArena game). The venv is the installed environment of TARGET's name (`textarena:` games:
the one named `textarena`), or the one `args.venv` names.

Rows come from the worker; the rollouts are run by the hosted harness
(producers/harnesses/hosted.py); the reward is the environment's own total, which the harness
puts in the rollout's state (its parts, metrics and stop reason beside it), so a judge scores
it without starting the worker."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from rlbus.config import ConfigError, data_dir, load_settings
from rlbus.environment.hosted.venvs import (
    envs_dir,
    installed_envs,
    normalized,
    read_record,
    venv_python,
)
from rlbus.environment.hosted.worker import HostedWorker, HostedWorkerError, WorkerSpec
from rlbus.environment.rules import Rule, Rules
from rlbus.environment.taskset import TaskSet

MODES: dict[str, tuple[str, ...]] = {
    "verifiers": ("episode", "steps"),
    "openenv": ("steps",),
    "textarena": ("steps",),
}
"""Each kind's modes (args.mode), its default first. episode: the worker plays each rollout
whole (the environment's own harness); steps: rlbus's chat loop plays it, the environment
answering each reply (reset, step, close); a V1 task set's one answer is scored offline."""
STATE = "hosted"
"""The rollout state key holding what the environment reported: reward, rewards, metrics."""
PAGE = 256
"""Task rows asked of the worker at a time."""


def installed_python(kind: str, target: str, venv: str | None) -> Path:
    """The interpreter of the venv the environment is installed in; ConfigError saying how to
    install it when it is not."""
    name = normalized(venv or ("textarena" if kind == "textarena" else target))
    data = data_dir(load_settings())
    root = envs_dir(data)
    record = read_record(root / name)
    if record is None:
        have = ", ".join(r.name for r in installed_envs(data)) or "none"
        raise ConfigError(
            f"{kind}:{target} runs in an environment of its own, and none named {name!r} is "
            f"installed in {root} (installed: {have}): `rlbus env install SPEC` it (a PyPI "
            f"name, a wheel, a folder), or name another with args.venv"
        )
    return venv_python(Path(record.path))


METRICS: dict[str, tuple[str, ...]] = {
    "verifiers": (),
    "openenv": ("steps", "invalid_actions"),
    "textarena": ("turns", "invalid_move"),
}
"""The metrics each kind's adapter reports for every rollout, scored as rlbus metrics. A V1
task set's own rewards and metrics vary by task set: they stay in the rollout's state."""


class EnvironmentReward:
    """The environment's own total, as its worker reported it for the rollout."""

    def __init__(self, spec: str):
        self.spec = spec

    def __call__(self, state: dict[str, Any]) -> float:
        return float(reported(state, self.spec)["reward"])

    def fingerprint(self) -> str:
        """What decides the values (rules_version): the environment, scored by itself."""
        return f"hosted {self.spec}"


class EnvironmentMetric(EnvironmentReward):
    """One of the metrics the environment's adapter reported for the rollout."""

    def __init__(self, spec: str, name: str):
        super().__init__(spec)
        self.name = name

    def __call__(self, state: dict[str, Any]) -> float:
        return float(reported(state, self.spec).get("metrics", {})[self.name])

    def fingerprint(self) -> str:
        return f"hosted {self.spec} metric {self.name}"


def reported(state: dict[str, Any], spec: str) -> dict[str, Any]:
    """What the environment reported for the rollout (ValueError when nothing was)."""
    found = state.get(STATE)
    if not isinstance(found, dict) or "reward" not in found:
        raise ValueError(f"the rollout's state holds no reward from {spec}")
    return found


class HostedTaskSet(TaskSet):
    kind: ClassVar[str] = ""
    target: ClassVar[str] = ""

    def __init__(self, **args: Any):
        super().__init__(**args)
        own = {k: v for k, v in args.items() if k != "venv"}
        self.spec = f"{self.kind}:{self.target}"
        self.mode = args.get("mode", MODES[self.kind][0])
        if self.mode not in MODES[self.kind]:
            raise ConfigError(
                f"{self.spec}: args.mode = {self.mode!r}; {self.kind} environments run in "
                f"{' or '.join(repr(m) for m in MODES[self.kind])}"
            )
        self.worker = HostedWorker(
            WorkerSpec(
                env=self.spec,
                python=installed_python(self.kind, self.target, args.get("venv")),
                kind=self.kind,
                target=self.target,
                args=own,
            )
        )
        # Where the environment's code runs is its own business (its worker's venv); rlbus's
        # runtime holds nothing for it.
        self.defaults = {"runtime": {"kind": "local"}}

    def _rows(self, split: str) -> Iterator[dict[str, Any]]:
        start = 0
        while True:
            try:
                page = self.worker.call("tasks", split=split, start=start, count=PAGE)
            except HostedWorkerError as exc:
                raise ConfigError(f"{self.spec}: its task set failed: {exc}") from exc
            yield from page
            if len(page) < PAGE:
                return
            start += len(page)

    def rows(self) -> Iterator[dict[str, Any]]:
        return self._rows("train")

    def eval_rows(self) -> Iterator[dict[str, Any]]:
        return self._rows("eval")

    def adapted_rules(self) -> Rules:
        reward = Rule("reward", "reward", 1.0, EnvironmentReward(self.spec), ("state",))
        metrics = [
            Rule(name, "metric", 0.0, EnvironmentMetric(self.spec, name), ("state",))
            for name in METRICS[self.kind]
        ]
        return Rules(rewards=[reward], metrics=metrics)


@functools.cache
def hosted_taskset_class(kind: str, target: str) -> type[HostedTaskSet]:
    """The task set of `KIND:TARGET` (one class per spec, so loading twice gives the same)."""
    if kind not in MODES:
        raise ConfigError(f"no hosted environment kind {kind!r} (known: {sorted(MODES)})")
    if not target:
        raise ConfigError(f"{kind}: names no environment (give {kind}:NAME)")
    name = normalized(target).replace("-", "_")
    return type(name, (HostedTaskSet,), {"kind": kind, "target": target, "name": name})


def hosted_spec(ref: str, venv: str | None = None) -> tuple[str, str] | None:
    """(kind, target) when `ref` names a hosted environment: `openenv:` and `textarena:` always,
    `verifiers:NAME` when `venv` is given or NAME is installed in a venv of its own (else it is
    a classic verifiers environment installed beside rlbus, environment/verifiers.py)."""
    kind, sep, target = ref.partition(":")
    if not sep or kind not in MODES:
        return None
    if kind == "verifiers" and venv is None:
        root = envs_dir(data_dir(load_settings()))
        if read_record(root / normalized(target)) is None:
            return None
    return kind, target
