"""Type-check the package with pyright, laid out as it installs.

The docs/architecture.md folders (`bus/`, `schemas/`, ...) install under `rlbus.*` through
setuptools' package-dir; pyright resolves imports from the tree alone and cannot follow the
editable install's import hook. So the package is copied into a scratch tree shaped as it
installs, checked there against this venv, and every path pyright prints is mapped back to the
file in the checkout. Exit status is pyright's.

    python .ci/typecheck.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, str]:
    """The installed package name of each source folder, from pyproject's package-dir."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return setuptools["package-dir"]


def build_tree(scratch: Path) -> dict[str, str]:
    """Copy each source folder to where it installs; returns scratch path -> checkout path."""
    back: dict[str, str] = {}
    for package, folder in sorted(package_dirs().items(), key=lambda item: item[0].count(".")):
        target = scratch.joinpath(*package.split("."))
        shutil.copytree(
            ROOT / folder, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
        )
        back[str(target)] = str(ROOT / folder)
    return back


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="rlbus-typecheck-") as tmp:
        scratch = Path(tmp)
        back = build_tree(scratch)
        config = {
            "include": ["rlbus"],
            # Adapters run in an environment's own venv (verifiers 0.4, OpenEnv, TextArena),
            # whose packages this venv does not hold; their tests run them there.
            "exclude": ["rlbus/environment/hosted/adapters"],
            "pythonVersion": "3.11",
            "typeCheckingMode": "basic",
            # An ignore names its rule; the reason is a comment beside it (ruff's E501 spares only
            # lines that end with the pragma, so it sits on the line above).
            "enableTypeIgnoreComments": True,
            "reportUnnecessaryTypeIgnoreComment": "error",
        }
        (scratch / "pyrightconfig.json").write_text(json.dumps(config))
        pyright = shutil.which("pyright") or "pyright"
        proc = subprocess.run(
            [pyright, "--pythonpath", sys.executable],
            cwd=scratch,
            capture_output=True,
            text=True,
        )
        # Longest scratch prefixes first: rlbus/bus must map before rlbus.
        out = proc.stdout + proc.stderr
        for tmp_path, real in sorted(back.items(), key=lambda item: -len(item[0])):
            out = out.replace(tmp_path, real)
        sys.stdout.write(out)
        return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
