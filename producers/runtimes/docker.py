"""`docker`: each program run is a `docker run --rm` of the configured image, as a container with
no network, no capabilities, no new privileges, a read-only root (a tmpfs /tmp) and the run's
memory, pids and CPU limits; the rollout's working directory is mounted at its own path. Given
the rollout's endpoint, the interception server also listens on a unix socket in that directory
and `relay.py` (run by the image's `python`) serves 127.0.0.1:PORT inside the container from it,
so the program's URLs work and reach nothing else. Variables reach the container by name from the
docker client's environment, never on its command line."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Sequence
from pathlib import Path

from rlbus.producers.runtimes.base import (
    ExecResult,
    Mount,
    ProcessRuntime,
    RolloutEndpoint,
    allowed_variables,
    run_process,
)

RELAY = Path(__file__).with_name("relay.py")
SOCKET = ".rlbus-model.sock"
"""The unix socket in the rollout's directory that the relay passes connections to."""
_CLIENT_ENV = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH")


def _mount_options(mount: Mount) -> tuple[str, ...]:
    if mount.source is None:  # the container sees none of the host: an empty directory there
        return ("--tmpfs", f"{mount.target}:ro")
    return ("-v", f"{mount.source}:{mount.target}{'' if mount.writable else ':ro'}")


class DockerRuntime(ProcessRuntime):
    kind = "docker"

    def command(
        self,
        name: str,
        workdir: Path,
        argv: list[str],
        env: dict[str, str],
        port: int | None,
        mounts: Sequence[Mount] = (),
    ) -> tuple[list[str], dict[str, str]]:
        """`docker run`'s argv and the docker client's environment for one program run."""
        config = self.config
        client = {k: os.environ[k] for k in _CLIENT_ENV if k in os.environ}
        # A variable the client needs itself (HOME, PATH) goes by value: those hold no secret.
        passed = [a for k, v in env.items() for a in ("-e", f"{k}={v}" if k in client else k)]
        limits: list[str] = []
        if config.memory_mb is not None:  # swap included: the limit is the container's memory
            limits += ["--memory", f"{config.memory_mb}m", "--memory-swap", f"{config.memory_mb}m"]
        if config.pids_max is not None:
            limits += ["--pids-limit", str(config.pids_max)]
        if config.cpus is not None:
            limits += ["--cpus", f"{config.cpus:g}"]
        if config.cpu_s is not None:
            limits += ["--ulimit", f"cpu={config.cpu_s}:{config.cpu_s + 1}"]
        relay = (
            []
            if port is None
            else ["python", "/rlbus/relay.py", str(port), str(workdir / SOCKET), "--"]
        )
        argv_out = [
            *("docker", "run", "--rm", "-i", "--name", name),
            *("--network", "none", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"),
            *("--read-only", "--tmpfs", "/tmp"),
            *("-v", f"{workdir}:{workdir}", "-w", str(workdir)),
            *(["-v", f"{RELAY}:/rlbus/relay.py:ro"] if port is not None else []),
            *(a for mount in mounts for a in _mount_options(mount)),
            *limits,
            *passed,
            *config.docker_args,
            config.image,
            *relay,
            *argv,
        ]
        return argv_out, {**client, **{k: v for k, v in env.items() if k not in client}}

    async def launch(
        self,
        workdir: Path,
        argv: list[str],
        env: dict[str, str],
        stdin: bytes | None,
        readable: Sequence[Path],
        endpoint: RolloutEndpoint | None,
        mounts: Sequence[Mount] = (),
    ) -> ExecResult:
        name = f"rlbus-{uuid.uuid4().hex[:12]}"
        run, client_env = self.command(
            name,
            workdir,
            argv,
            allowed_variables(self.config, workdir, env),
            endpoint.port if endpoint is not None else None,
            mounts,
        )

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

        serving: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()
        listener = None
        if endpoint is not None:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(workdir / SOCKET))
            listener.listen(128)
            serving = endpoint.serving(listener)
        try:
            async with serving:
                return await run_process(
                    run,
                    env=client_env,
                    cwd=workdir,
                    config=self.config,
                    stdin=stdin,
                    on_timeout=kill_container,
                )
        finally:
            if listener is not None:
                listener.close()
