"""`docker`: each program run is a `docker run --rm` of the configured image, with the rollout's
working directory mounted at /work and host networking (so loopback interception URLs work)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from rlbus.config.env import RuntimeConfig
from rlbus.producers.runtimes.base import ExecResult, Workdir, run_process, workdir


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
        return f"no Docker engine: {(done.stderr or done.stdout).strip().splitlines()[-1]}"
    return None


@dataclass
class DockerSandbox:
    directory: Workdir
    config: RuntimeConfig

    @property
    def workdir(self) -> Path:
        return self.directory.path

    async def run(
        self, argv: list[str], env: dict[str, str], stdin: bytes | None = None
    ) -> ExecResult:
        name = f"rlbus-{uuid.uuid4().hex[:12]}"
        limits = [
            *(
                [
                    "--memory",
                    f"{self.config.memory_mb}m",
                    "--memory-swap",
                    f"{self.config.memory_mb}m",
                ]
                if self.config.memory_mb
                else []
            ),
            *(["--cpus", str(self.config.cpu_s)] if self.config.cpu_s else []),
        ]
        run = [
            "docker",
            "run",
            "--rm",
            "-i",
            "--name",
            name,
            "--network",
            "host",
            "-v",
            f"{self.workdir}:/work",
            "-w",
            "/work",
            *limits,
            *[a for k, v in env.items() for a in ("-e", f"{k}={v}")],
            *self.config.docker_args,
            self.config.image,
            *argv,
        ]

        async def kill_container() -> None:
            # Killing the `docker run` client would leave the container running.
            proc = await asyncio.create_subprocess_exec(
                "docker",
                "kill",
                name,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await proc.wait()

        return await run_process(
            run,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            cwd=self.workdir,
            config=self.config,
            stdin=stdin,
            on_timeout=kill_container,
        )


class DockerRuntime:
    kind = "docker"

    def __init__(self, config: RuntimeConfig):
        self.config = config

    @contextlib.asynccontextmanager
    async def sandbox(self, rollout_id: str) -> AsyncIterator[DockerSandbox]:
        async with workdir(rollout_id, self.config.keep_workdir) as directory:
            yield DockerSandbox(directory, self.config)
