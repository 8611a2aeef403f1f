"""Whether a Docker engine answers on this machine: asked by the docker runtime before it runs a
container, and by task sets whose tasks need an image (Harbor) when they load."""

from __future__ import annotations

import shutil
import subprocess


def docker_problem() -> str | None:
    """Why containers cannot run here, or None when a Docker engine answers."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    try:
        done = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`docker info` failed: {exc}"
    if done.returncode != 0:
        return f"no Docker engine: {(done.stderr or done.stdout).strip()[-200:]}"
    return None
