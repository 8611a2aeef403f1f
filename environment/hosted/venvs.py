"""Environment packages in venvs of their own (`rlbus env install`, `list`, `remove`).

An environment written for another framework (a verifiers V1 package, an OpenEnv, TextArena or
Harbor environment, or one of rlbus's own) brings pins that need not agree with rlbus's, so each
goes into a venv of its own: `DATA_DIR/envs/NAME`, NAME the distribution's normalized name (PEP
503), made with `python -m venv` and filled by that venv's pip (the package and its own
dependencies, not byte-compiled ahead; nothing of rlbus's environment is visible to it). Beside
the venv's files, `rlbus-env.json` records the spec, the distribution and its version, the
venv's Python, when, and the importable modules the distribution provides (its top_level.txt,
else its RECORD, read by the venv's own python). A directory without that record is a leftover
and is replaced.

pip and the package's build run with an allow-listed environment (`PASSED`): rlbus's settings
and secrets (RLBUS_*, API keys) are not passed on. A spec pip cannot install leaves nothing
behind; a failed `--force` reinstall leaves the previous venv as it was.

An installed environment runs in a worker of its own (host.py, by the venv's python; see
worker.py and taskset.py beside this module).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

RECORD = "rlbus-env.json"
"""The record of an installed environment, in its venv's directory."""

PASSED = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "SSH_AUTH_SOCK",
    "GIT_SSH_COMMAND",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
)
"""The variables `python -m venv`, pip and the package's build see from this process's
environment, with every PIP_* (the user's pip settings: index, find-links, cache)."""

PIP_TAIL = 25
"""Lines of pip's output an install error quotes (pip ends a build failure with a few lines of
its own; the package's error comes just before)."""

_NAME = re.compile(
    r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?\s*(?:@|[<>=!~;(]|$)"
)
"""A PEP 508 requirement's name (`name`, `name[extra]>=1`, `name @ URL`)."""
_EGG = re.compile(r"[#&]egg=([A-Za-z0-9][A-Za-z0-9._-]*)")

_PROBE = """
import json, platform, sys
from importlib import metadata
dist = metadata.distribution(sys.argv[1])
top = (dist.read_text("top_level.txt") or "").split()
if not top:
    for f in dist.files or []:
        first = f.parts[0]
        if first in ("..", "__pycache__") or first.endswith((".dist-info", ".data", ".pth")):
            continue
        if first.startswith("__editable__"):
            continue
        top.append(first.split(".")[0] if len(f.parts) == 1 else first)
modules = sorted({m for m in top if m.isidentifier()})
print(json.dumps({"distribution": dist.metadata["Name"], "version": dist.version,
                  "modules": modules, "python": platform.python_version()}))
"""
"""Run by the venv's python: what the installed distribution is and provides."""


class EnvInstallError(RuntimeError):
    """An environment that cannot be installed, found or removed; the message says what to do."""


@dataclass(frozen=True)
class InstalledEnv:
    """What `rlbus-env.json` says of an installed environment."""

    name: str
    """The distribution's normalized name: the venv's directory and what `remove` takes."""
    spec: str
    """What was installed (a local path made absolute)."""
    distribution: str
    """The name as its metadata spells it."""
    version: str
    python: str
    """The venv's Python version."""
    installed_at: str
    """UTC, ISO 8601."""
    modules: list[str] = field(default_factory=list)
    """Importable top-level modules the distribution provides."""
    index: str | None = None
    """The hub-style index it came from (`--index`), if any."""
    index_only: bool = False
    """Whether that index was the only one (pip's --index-url) or one beside PyPI."""
    path: str = ""
    """The venv (not stored: where the record was found)."""


def envs_dir(data_dir: Path) -> Path:
    """Where installed environments live: RLBUS_ENVS_DIR, else DATA_DIR/envs."""
    chosen = os.environ.get("RLBUS_ENVS_DIR")
    return Path(chosen).resolve() if chosen else data_dir.resolve() / "envs"


def normalized(name: str) -> str:
    """PEP 503: runs of -, _ and . are one -, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def venv_python(venv: Path) -> Path:
    """The venv's interpreter."""
    return venv / "bin" / "python"


def passed_environment() -> dict[str, str]:
    """This process's environment as venv, pip and a package's build see it (`PASSED`)."""
    return {k: v for k, v in os.environ.items() if k in PASSED or k.startswith("PIP_")}


def pip_spec(spec: str) -> str:
    """What pip is given: an existing local path made absolute (a bare `name` that is also a
    folder here would otherwise be ambiguous), anything else as it is."""
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec


def name_of_spec(spec: str) -> str | None:
    """The distribution a spec installs, where the spec alone says it: a requirement (`name`,
    `name==1.2`, `name @ URL`), a wheel's or sdist's file name, a folder's static
    `[project] name`, a URL's `#egg=`; None when only pip can tell (it builds the metadata)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        try:
            project = tomllib.loads((path / "pyproject.toml").read_text()).get("project", {})
        except (OSError, tomllib.TOMLDecodeError):
            return None
        name = project.get("name")
        return name if isinstance(name, str) and "name" not in project.get("dynamic", []) else None
    file_name = path.name if path.is_file() else spec.rsplit("/", 1)[-1].split("#")[0]
    if file_name.endswith(".whl"):
        return file_name.split("-")[0]
    for suffix in (".tar.gz", ".zip"):
        if file_name.endswith(suffix) and "-" in file_name:
            return file_name[: -len(suffix)].rsplit("-", 1)[0]
    if path.is_file():
        return None
    if egg := _EGG.search(spec):
        return egg.group(1)
    if "://" in spec.split("@")[0]:
        return None
    found = _NAME.match(spec.strip())
    return found.group(1) if found else None


def read_record(venv: Path) -> InstalledEnv | None:
    try:
        data = json.loads((venv / RECORD).read_text())
    except (OSError, ValueError):
        return None
    data.pop("path", None)
    return InstalledEnv(**data, path=str(venv))


def installed_envs(data_dir: Path) -> list[InstalledEnv]:
    """Every installed environment, by name."""
    root = envs_dir(data_dir)
    found = (read_record(venv) for venv in sorted(root.iterdir())) if root.is_dir() else ()
    return [record for record in found if record is not None]


def remove_env(data_dir: Path, name: str) -> InstalledEnv:
    """Remove an installed environment's venv; returns what it was."""
    venv = envs_dir(data_dir) / normalized(name)
    record = read_record(venv)
    if record is None:
        names = ", ".join(r.name for r in installed_envs(data_dir)) or "none"
        raise EnvInstallError(
            f"no environment {name!r} is installed in {envs_dir(data_dir)} (installed: {names})"
        )
    shutil.rmtree(venv)
    return record


def install_env(
    data_dir: Path,
    spec: str,
    *,
    index: str | None = None,
    index_only: bool = False,
    python: str = sys.executable,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> InstalledEnv:
    """Install `spec` (a PyPI requirement, a wheel or sdist, a local folder or a URL pip takes,
    `git+https://...` included) into a venv of its own under `envs_dir(data_dir)`; `index` a
    hub-style package index (beside PyPI, or alone with `index_only`)."""
    root = envs_dir(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    given = pip_spec(spec)
    index_args = ["--index-url" if index_only else "--extra-index-url", index] if index else []
    name = name_of_spec(given) or _name_from_pip(given, index_args, python, root, say)
    name = normalized(name)
    venv = root / name
    existing = read_record(venv)
    if existing is not None and not force:
        raise EnvInstallError(
            f"environment {name!r} is already installed ({existing.distribution} "
            f"{existing.version} from {existing.spec}, in {venv}): --force installs it again"
        )
    with _replacing(venv, say):
        say(f"creating {venv}")
        run_passed([python, "-m", "venv", str(venv)], f"environment {name!r}: python -m venv")
        report = venv / ".rlbus-pip-report.json"
        say(f"pip install {given}")
        pip = [str(venv_python(venv)), "-m", "pip", "install", "--disable-pip-version-check"]
        # --no-compile, as uv installs by default: only what the environment imports gets
        # compiled, on first use. OpenEnv's 103 packages (gradio, pandas) installed in 28 s
        # instead of 46.
        run_passed(
            [*pip, "--no-input", "--no-compile", "--report", str(report), *index_args, given],
            f"environment {name!r}: pip could not install {spec}",
        )
        requested = [
            item["metadata"]
            for item in json.loads(report.read_text()).get("install", [])
            if item.get("requested")
        ]
        report.unlink()
        if len(requested) != 1 or normalized(requested[0]["name"]) != name:
            got = ", ".join(f"{m['name']} {m['version']}" for m in requested) or "nothing"
            raise EnvInstallError(
                f"environment {name!r}: pip installed {got} for {spec}, not {name}"
            )
        probe = run_passed(
            [str(venv_python(venv)), "-c", _PROBE, requested[0]["name"]],
            f"environment {name!r}: its venv's python cannot read what was installed",
        )
        found = json.loads(probe.stdout)
        record = InstalledEnv(
            name=name,
            spec=given,
            distribution=found["distribution"],
            version=found["version"],
            python=found["python"],
            installed_at=datetime.now(UTC).isoformat(timespec="seconds"),
            modules=found["modules"],
            index=index,
            index_only=index_only,
        )
        stored = {k: v for k, v in asdict(record).items() if k != "path"}
        (venv / RECORD).write_text(json.dumps(stored, indent=2) + "\n")
    return InstalledEnv(**{**asdict(record), "path": str(venv)})


@contextmanager
def _replacing(venv: Path, say: Callable[[str], None]) -> Iterator[None]:
    """Make `venv` in the block: a previous one waits aside and comes back if the block fails,
    goes if it succeeds; a failed one is removed."""
    aside = None
    if venv.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{venv.name}.replaced-", dir=venv.parent))
        venv.rename(aside / venv.name)
    try:
        yield
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)  # no half-made venv left behind
        if aside is not None:
            (aside / venv.name).rename(venv)
            shutil.rmtree(aside, ignore_errors=True)
        raise
    if aside is not None:
        say(f"removing the previous {venv.name}")
        shutil.rmtree(aside, ignore_errors=True)


def _name_from_pip(
    spec: str, index_args: list[str], python: str, root: Path, say: Callable[[str], None]
) -> str:
    """The distribution `spec` installs, as pip reports it (a dry run in a throwaway venv:
    building a package's metadata can run its code, never in rlbus's environment)."""
    say(f"asking pip what {spec} is")
    with tempfile.TemporaryDirectory(prefix=".probe-", dir=root) as scratch:
        venv, report = Path(scratch) / "venv", Path(scratch) / "report.json"
        run_passed([python, "-m", "venv", str(venv)], f"python -m venv for {spec}")
        pip = [str(venv_python(venv)), "-m", "pip", "install", "--disable-pip-version-check"]
        pip += ["--no-input", "--dry-run", "--no-deps", "--ignore-installed"]
        run_passed(
            [*pip, "--report", str(report), *index_args, spec], f"pip could not install {spec}"
        )
        items = json.loads(report.read_text()).get("install", [])
    names = [item["metadata"]["name"] for item in items if item.get("requested")]
    if len(names) != 1:
        raise EnvInstallError(f"pip could not say which distribution {spec} is ({names})")
    return names[0]


def run_passed(argv: list[str], failed: str) -> subprocess.CompletedProcess[str]:
    """Run argv with the passed environment; `EnvInstallError(failed + its last lines)` when it
    does not exit 0."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=passed_environment(), check=False
        )
    except OSError as exc:
        raise EnvInstallError(f"{failed}: cannot run {argv[0]} ({exc})") from exc
    if done.returncode != 0:
        tail = (done.stdout.rstrip() + "\n" + done.stderr.rstrip()).strip().splitlines()
        raise EnvInstallError(
            f"{failed} (exit {done.returncode}); its last lines:\n" + "\n".join(tail[-PIP_TAIL:])
        )
    return done
