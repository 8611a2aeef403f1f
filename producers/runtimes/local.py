"""`local`: programs run as plain child processes of the producer (its environment, no limits
but the time limit), each rollout in its own temporary directory."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from rlbus.config.env import RuntimeConfig
from rlbus.producers.runtimes.base import ExecResult, Workdir, run_process, workdir


@dataclass
class ProcessSandbox:
    directory: Workdir
    config: RuntimeConfig
    scrubbed: bool

    @property
    def workdir(self) -> Path:
        return self.directory.path

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        if not self.scrubbed:
            return {**os.environ, **env}
        kept = {k: os.environ[k] for k in self.config.keep_env if k in os.environ}
        home = str(self.workdir)
        return {**kept, "HOME": home, "TMPDIR": home, **env}

    async def run(
        self, argv: list[str], env: dict[str, str], stdin: bytes | None = None
    ) -> ExecResult:
        return await run_process(
            argv,
            env=self.environment(env),
            cwd=self.workdir,
            config=self.config,
            stdin=stdin,
            limited=self.scrubbed,
        )


class LocalRuntime:
    kind = "local"
    scrubbed = False

    def __init__(self, config: RuntimeConfig):
        self.config = config

    @contextlib.asynccontextmanager
    async def sandbox(self, rollout_id: str) -> AsyncIterator[ProcessSandbox]:
        async with workdir(rollout_id, self.config.keep_workdir) as directory:
            yield ProcessSandbox(directory, self.config, self.scrubbed)


class SubprocessRuntime(LocalRuntime):
    """`subprocess`: own process group and working directory, an environment holding only
    `keep_env` plus what the harness sets, address-space and CPU limits, killed on timeout."""

    kind = "subprocess"
    scrubbed = True
