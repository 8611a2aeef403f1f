"""Virtual environments of their own for benchmarks that run another project whose pins
cannot share rlbus's venv (TRL, verifiers 0.4), made through pip the first time."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def own_venv(path: Path, installs: Sequence[Sequence[str]], probe: str) -> Path:
    """The python of the venv at `path`, where the Python code `probe` must run; when it does
    not, the venv is made afresh and each group of `installs` pip-installed in order (torch
    first, pinned, where it is needed: a looser pin would pull CUDA wheels)."""
    python = path / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", probe]).returncode == 0:
        return python
    print(f"making {path} (pip install {'; '.join(' '.join(i) for i in installs)})", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", path], check=True)
    for packages in installs:
        subprocess.run([python, "-m", "pip", "install", "-q", *packages], check=True)
    return python
