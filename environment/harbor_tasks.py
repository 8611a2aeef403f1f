"""Reading Harbor task folders as Harbor documents them, without harbor (it needs Python 3.12):
task.toml, instruction.md, the environment's Dockerfile (judged: can the sandbox stand in for
it?), and the reward file the verifier writes. environment/harbor.py runs them."""

from __future__ import annotations

import json
import math
import posixpath
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbus.config import ConfigError

TASK_TOML = "task.toml"
INSTRUCTION = "instruction.md"
DEFAULT_TIMEOUT_S = 600.0
"""Harbor's [agent] and [verifier] timeout_sec when task.toml sets none."""
SANDBOX_BASES = frozenset({"python", "ubuntu", "debian", "buildpack-deps"})
"""Base images whose plain userland this host's (the sandbox shows the host's /usr) stands in
for: a Debian-like system with Python and bash."""
IGNORED = frozenset(
    {"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "MAINTAINER", "STOPSIGNAL", "HEALTHCHECK"}
)
"""Dockerfile instructions that change nothing the agent or the tests see (Harbor keeps its
container alive with its own command)."""


@dataclass(frozen=True)
class Copy:
    """A COPY of files from the build context (the task's environment folder)."""

    sources: tuple[str, ...]
    destination: str
    """Absolute, as the image would have it."""
    into: bool
    """The destination is a folder (a trailing slash, or several sources)."""


@dataclass(frozen=True)
class Dockerfile:
    base: str
    workdir: str | None
    copies: tuple[Copy, ...]
    beyond_sandbox: str | None
    """The first thing only a built image gives (`line 3: RUN apt-get ...`); None when the
    sandbox can stand in for the image."""


@dataclass(frozen=True)
class HarborTask:
    name: str
    directory: Path
    instruction: str
    metadata: dict[str, Any]
    agent_timeout_s: float
    verifier_timeout_s: float
    cpus: float | None
    memory_mb: int | None
    image: str | None
    """task.toml [environment] docker_image."""
    dockerfile: Dockerfile | None

    @property
    def workdir(self) -> str | None:
        """Where the agent works in the image (its Dockerfile's WORKDIR)."""
        return self.dockerfile.workdir if self.dockerfile else None

    @property
    def container(self) -> str | None:
        """Why the task needs a container (None: the sandbox runs it)."""
        if self.image:
            return f"the container image {self.image} (task.toml [environment] docker_image)"
        if self.dockerfile is not None and self.dockerfile.beyond_sandbox:
            return (
                f"an image built from {self.directory}/environment/Dockerfile "
                f"({self.dockerfile.beyond_sandbox})"
            )
        return None


def _instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, KEYWORD, arguments) per instruction: continuations joined, comments dropped."""
    out: list[tuple[int, str, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        start = start or number
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        keyword, _, args = (pending + line).strip().partition(" ")
        out.append((start, keyword.upper(), args.strip()))
        pending, start = "", 0
    return out


def _image_name(image: str) -> str:
    """`docker.io/library/python:3.12-slim@sha256:...` -> `python`."""
    name = image.split("@", 1)[0]
    head, _, tail = name.rpartition(":")
    if head and "/" not in tail:
        name = head
    for prefix in ("docker.io/", "index.docker.io/", "library/"):
        name = name.removeprefix(prefix)
    return name


def _copy_args(args: str) -> list[str]:
    if args.startswith("["):
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(a, str) for a in parsed):
            return parsed
    return shlex.split(args)


def read_dockerfile(path: Path) -> Dockerfile:
    """Judge a Dockerfile: the sandbox stands in for one that names a plain base image
    (SANDBOX_BASES), sets WORKDIR and COPYs files from its build context into that WORKDIR.
    Anything else (RUN, ENV, USER, ADD, another base, a multi-stage build) needs the image."""
    base, workdir, copies = "", None, []
    beyond: str | None = None
    for line, keyword, args in _instructions(path.read_text(errors="replace")):
        said = f"line {line}: {keyword} {args}"[:120]
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            if base:
                beyond = beyond or f"{said} (a multi-stage build)"
            base = words[0] if words else ""
            if _image_name(base) not in SANDBOX_BASES:
                beyond = beyond or f"{said} (not a plain {'/'.join(sorted(SANDBOX_BASES))} base)"
        elif keyword == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir or "/", args.strip("\"'")))
        elif keyword == "COPY":
            words = _copy_args(args)
            if any(w.startswith("--from") for w in words):
                beyond = beyond or f"{said} (copies from another image)"
                continue
            words = [w for w in words if not w.startswith("--")]  # --chown, --chmod, --link
            if len(words) < 2:
                beyond = beyond or f"{said} (unreadable)"
                continue
            *sources, destination = words
            absolute = posixpath.normpath(posixpath.join(workdir or "/", destination))
            into = destination.endswith("/") or len(sources) > 1
            copies.append(Copy(tuple(sources), absolute, into))
        elif keyword not in IGNORED:
            beyond = beyond or said
    for copy in copies:
        inside = workdir is not None and (
            copy.destination == workdir or copy.destination.startswith(workdir.rstrip("/") + "/")
        )
        if not inside:
            beyond = beyond or (
                f"COPY to {copy.destination}, outside the WORKDIR the agent works in"
            )
    return Dockerfile(base, workdir, tuple(copies), beyond)


_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_MIB = {"": 1 / (1 << 20), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1 << 20}


def _memory_mb(environment: dict[str, Any], where: str) -> int | None:
    """[environment] memory_mb, or the older memory = "2G"."""
    if "memory_mb" in environment:
        return int(environment["memory_mb"])
    if "memory" not in environment:
        return None
    match = _MEMORY.match(str(environment["memory"]))
    if match is None:
        raise ConfigError(f"{where} [environment] memory = {environment['memory']!r}: not a size")
    return max(16, math.ceil(float(match[1]) * _MIB[match[2].lower()]))


def _number(table: dict[str, Any], key: str, default: float, where: str) -> float:
    value = table.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{where} {key} = {value!r}: give a positive number of seconds")
    return float(value)


def read_task(directory: Path) -> HarborTask:
    """One task folder; ConfigError naming the file and what is wrong."""
    name = directory.name
    where = f"harbor task {name} ({directory / TASK_TOML})"
    try:
        config = tomllib.loads((directory / TASK_TOML).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read it: {exc}") from exc
    try:
        instruction = (directory / INSTRUCTION).read_text()
    except OSError as exc:
        raise ConfigError(f"harbor task {name} has no readable {INSTRUCTION}: {exc}") from exc
    if not (directory / "tests" / "test.sh").is_file():
        raise ConfigError(f"harbor task {name} has no verifier: no {directory}/tests/test.sh")
    environment = config.get("environment", {})
    dockerfile_path = directory / "environment" / "Dockerfile"
    dockerfile = read_dockerfile(dockerfile_path) if dockerfile_path.is_file() else None
    image = environment.get("docker_image") or None
    if dockerfile is None and image is None:
        raise ConfigError(
            f"harbor task {name} has neither {directory}/environment/Dockerfile nor "
            "[environment] docker_image in its task.toml"
        )
    cpus = environment.get("cpus")
    return HarborTask(
        name=name,
        directory=directory,
        instruction=instruction,
        metadata=dict(config.get("metadata", {})),
        agent_timeout_s=_number(config.get("agent", {}), "timeout_sec", DEFAULT_TIMEOUT_S, where),
        verifier_timeout_s=_number(
            config.get("verifier", {}), "timeout_sec", DEFAULT_TIMEOUT_S, where
        ),
        cpus=float(cpus) if cpus is not None else None,
        memory_mb=_memory_mb(environment, where),
        image=image,
        dockerfile=dockerfile,
    )


def read_folder(root: Path) -> list[HarborTask]:
    """`root` as one task folder (it holds task.toml) or a dataset (folders that do), sorted."""
    if not root.is_dir():
        raise ConfigError(f"harbor:{root}: no such folder")
    if (root / TASK_TOML).is_file():
        return [read_task(root)]
    folders = sorted(p for p in root.iterdir() if (p / TASK_TOML).is_file())
    if not folders:
        raise ConfigError(
            f"harbor:{root} is neither a Harbor task folder (no {TASK_TOML}) nor a folder of "
            f"task folders (none of its folders holds a {TASK_TOML})"
        )
    return [read_task(p) for p in folders]


class RewardFileError(ValueError):
    """The verifier left no usable reward."""


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardFileError(f"{what} is {value!r}, not a number")
    if not math.isfinite(value):
        raise RewardFileError(f"{what} is {value}, not finite")
    return float(value)


def read_reward(verifier_dir: Path) -> dict[str, Any]:
    """What the verifier wrote, as Harbor reads it: reward.json first, else reward.txt.
    {"reward": x, "metrics": {other numeric keys}, "other": {the rest}}; RewardFileError when
    neither holds a reward."""
    as_json, as_text = verifier_dir / "reward.json", verifier_dir / "reward.txt"
    if as_json.is_file():
        try:
            data = json.loads(as_json.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RewardFileError(f"reward.json is not JSON: {exc}") from exc
        if not isinstance(data, dict) or not data:
            raise RewardFileError(f"reward.json holds {data!r:.80}, not an object with a reward")
        # Harbor names the main reward "reward"; a file of one key means that one.
        key = "reward" if "reward" in data or len(data) != 1 else next(iter(data))
        if key not in data:
            raise RewardFileError(f"reward.json has no 'reward' key (keys: {sorted(data)})")
        out: dict[str, Any] = {"reward": _finite(data[key], f"reward.json's {key!r}")}
        rest = {k: v for k, v in data.items() if k != key}
        numbers = {
            k: float(v)
            for k, v in rest.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        if numbers:
            out["metrics"] = numbers
        if other := {k: v for k, v in rest.items() if k not in numbers}:
            out["other"] = other
        return out
    if as_text.is_file():
        text = as_text.read_text(errors="replace").strip()
        if not text:
            raise RewardFileError("reward.txt is empty")
        try:
            value = float(text)
        except ValueError as exc:
            raise RewardFileError(f"reward.txt holds {text[:80]!r}, not a number") from exc
        return {"reward": _finite(value, "reward.txt")}
    raise RewardFileError("it wrote neither /logs/verifier/reward.json nor reward.txt")
