"""Finding an environment by what the user typed: a TOML file or a directory holding env.toml,
an installed entry point (group "rlbus.environments"), package.module:Class, FILE.py[:Class],
verifiers:NAME (a verifiers environment: V1 hosted in the venv `rlbus env install` made for NAME,
else a classic one installed beside rlbus), openenv:PACKAGE or textarena:GAME (hosted, see
environment/hosted/venv_taskset.py)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from rlbus.config import ConfigError, deep_merge, format_validation_error
from rlbus.config.env import EnvConfig
from rlbus.environment.hosted.venv_taskset import hosted_spec, hosted_taskset_class
from rlbus.environment.rules import Rules, discover
from rlbus.environment.task_sources.sources import to_task
from rlbus.environment.task_sources.stream import TaskStream
from rlbus.environment.taskset import TaskSet

GROUP = "rlbus.environments"
VERIFIERS = "verifiers:"
"""`verifiers:NAME`: an installed verifiers environment (see environment/verifiers.py)."""
HARBOR = "harbor:"
"""`harbor:PATH`: a Harbor task folder or a folder of them (see environment/harbor.py)."""
ENV_FILE = "env.toml"


@dataclass
class Environment:
    """A task set with its run configuration and discovered rules."""

    id: str
    taskset: TaskSet
    config: EnvConfig
    rules: Rules
    spec: str
    """What it was loaded from, resolved so another process can load it the same way."""
    root: Path
    """The directory of its TOML or Python file (the working directory for module references)."""

    def tasks(self, run_id: str = "") -> TaskStream:
        """The task set's rows as TaskPublished events of this environment (lazy)."""
        return self._stream(self.taskset.rows, run_id)

    def eval_tasks(self, run_id: str = "") -> TaskStream:
        """The tasks to evaluate on: the task set's `eval_rows` where it has them (a verifiers
        environment's eval dataset), else its rows."""
        return self._stream(getattr(self.taskset, "eval_rows", self.taskset.rows), run_id)

    def _stream(self, rows: Callable[[], Iterable[Any]], run_id: str) -> TaskStream:
        return TaskStream(
            lambda: (to_task(row, self.id, run_id, replace_env=True) for row in rows())
        )


def _import_file(path: Path) -> ModuleType:
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(f"no task set file {path}")
    # One module per file path: loading an environment twice gives the same classes.
    name = f"rlbus_env_{path.stem}_{hashlib.blake2b(str(path).encode(), digest_size=4).hexdigest()}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _only_taskset(module: ModuleType, where: str) -> type[TaskSet]:
    found = [
        v
        for v in vars(module).values()
        if inspect.isclass(v)
        and issubclass(v, TaskSet)
        and v is not TaskSet
        and v.__module__ == module.__name__
    ]
    if len(found) != 1:
        names = [c.__name__ for c in found]
        raise ConfigError(
            f"{where} defines {len(found)} task sets {names}; name one as {where}:Class"
        )
    return found[0]


def _entry_point(name: str) -> type[TaskSet] | None:
    matches = entry_points(group=GROUP, name=name)
    return next(iter(matches)).load() if matches else None


def resolve_taskset(
    ref: str, base_dir: Path | None = None, venv: str | None = None
) -> tuple[type[TaskSet], str]:
    """The TaskSet class `ref` names, and `ref` resolved (file paths made absolute); `venv`, the
    installed environment a hosted one runs in when it is not the one of its own name."""
    target, _, attr = ref.partition(":")
    if (hosted := hosted_spec(ref, venv)) is not None:
        cls, resolved = hosted_taskset_class(*hosted), ref
    elif ref.startswith(VERIFIERS):
        from rlbus.environment.verifiers import taskset_class

        cls, resolved = taskset_class(ref[len(VERIFIERS) :]), ref
    elif ref.startswith(HARBOR):
        from rlbus.environment.harbor import harbor_taskset_class as harbor_taskset

        folder = ref[len(HARBOR) :]  # relative: to the env.toml's folder, else this directory
        cls, resolved = harbor_taskset(folder and str((base_dir or Path.cwd()) / folder))
    elif target.endswith(".py"):
        path = Path(target) if base_dir is None or Path(target).is_absolute() else base_dir / target
        module = _import_file(path)
        resolved = f"{path.resolve()}{':' + attr if attr else ''}"
        cls = getattr(module, attr, None) if attr else _only_taskset(module, str(path))
    elif attr:
        module = importlib.import_module(target)
        cls, resolved = getattr(module, attr, None), ref
    else:
        cls, resolved = _entry_point(ref), ref
        if cls is None:
            known = sorted(ep.name for ep in entry_points(group=GROUP))
            raise ConfigError(
                f"no environment {ref!r}: not a .toml/.py path, module:Class, verifiers:NAME, or "
                f"an installed entry point in group {GROUP!r} (installed: {known or 'none'})"
            )
    if not (inspect.isclass(cls) and issubclass(cls, TaskSet)):
        raise ConfigError(f"{ref} is {cls!r}, not a TaskSet subclass")
    return cls, resolved


def read_env_table(path: Path) -> dict[str, Any]:
    """The `[env]` table of an env.toml (or the whole file when it has none)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read environment config {path}: {exc}") from exc
    table = data.get("env", data)
    if "taskset" not in table:
        raise ConfigError(f'{path} names no taskset (add taskset = "file.py:Class" under [env])')
    return table


def load_environment(spec: str, overrides: dict[str, Any] | None = None) -> Environment:
    """Load an environment; `overrides` (EnvConfig fields, nested dicts) win over the TOML, which
    wins over the task set's `defaults`. Raises ConfigError naming what is wrong."""
    path = Path(spec)
    file = path / ENV_FILE if path.is_dir() else path if spec.endswith(".toml") else None
    table: dict[str, Any] = {}
    if file is not None:
        table = read_env_table(file)
    venv = deep_merge(table, overrides or {}).get("args", {}).get("venv")
    if file is not None:
        cls, ref = resolve_taskset(table["taskset"], file.parent, venv)
    else:
        cls, ref = resolve_taskset(spec, venv=venv)

    def configured(defaults: dict[str, Any]) -> EnvConfig:
        merged = deep_merge(deep_merge(dict(defaults), table), overrides or {})
        try:
            return EnvConfig(**{**merged, "taskset": ref})
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, f"environment {spec}")) from exc

    config = configured(cls.defaults)
    taskset = cls(**config.args)
    if taskset.defaults is not cls.defaults:
        # A task set that learns its defaults from what it loaded (a verifiers environment: its
        # harness, turns and sampling) sets them on itself; the TOML and the CLI still win.
        config = configured(taskset.defaults)
    env_id = config.id or cls.env_id()
    source = (
        file.resolve()
        if file
        else Path(ref.partition(":")[0])
        if ref.partition(":")[0].endswith(".py")
        else None
    )
    # A task set adapted from another framework builds its rules from what it loaded.
    adapted = getattr(taskset, "adapted_rules", None)
    return Environment(
        env_id,
        taskset,
        config,
        adapted() if adapted is not None else discover(taskset),
        str(source) if file else ref,
        source.parent if source else Path.cwd(),
    )
