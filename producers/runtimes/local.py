"""`local`: programs run as plain child processes of the producer (its environment, no limits but
the time limit). `subprocess`: no sandbox either (the program sees the host's files, processes and
network), but an allow-listed environment, no capabilities, and its whole process tree bounded
and killed."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from rlbus.config.env import RuntimeConfig
from rlbus.producers.runtimes.base import (
    ExecResult,
    Mount,
    ProcessRuntime,
    RolloutEndpoint,
    allowed_variables,
    cpu_limit,
    die_with_parent,
    refuse_mounts,
    run_process,
)
from rlbus.producers.runtimes.linux import (
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_SECUREBITS,
    effective_capabilities,
    prctl,
)
from rlbus.producers.runtimes.tree import describe_trees, hold_tree

log = logging.getLogger(__name__)

# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP and SECBIT_KEEP_CAPS, each with its lock bit: uid 0
# gets no capabilities from exec, and the program cannot undo that.
_NO_ROOT_PRIVILEGES = 0b1 | 0b10 | 0b100 | 0b1000 | 0b10_0000


class LocalRuntime(ProcessRuntime):
    kind = "local"

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
        if refused := refuse_mounts(self.kind, mounts):
            return refused
        return await run_process(
            argv, env={**os.environ, **env}, cwd=workdir, config=self.config, stdin=stdin
        )


@functools.cache
def hide_this_process() -> None:
    """Make this process non-dumpable: a process without CAP_SYS_PTRACE (every program the
    subprocess runtime starts) can no longer read its /proc/PID/environ, mem or fds."""
    prctl(PR_SET_DUMPABLE, 0)
    log.info(
        "%s; this process is non-dumpable (programs cannot read its environment)", describe_trees()
    )


def _no_privileges(capable: bool) -> None:
    """In the child: no capabilities after exec, even as root, and no way to gain any (setuid
    binaries and file capabilities included)."""
    if capable:
        prctl(PR_SET_SECUREBITS, _NO_ROOT_PRIVILEGES)
    prctl(PR_SET_NO_NEW_PRIVS, 1)


class SubprocessRuntime(ProcessRuntime):
    kind = "subprocess"

    def __init__(self, config: RuntimeConfig):
        super().__init__(config)
        hide_this_process()
        self._capable = effective_capabilities() != 0

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
        if refused := refuse_mounts(self.kind, mounts):
            return refused
        limits = [cpu_limit(self.config.cpu_s)] if self.config.cpu_s is not None else []
        return await run_process(
            argv,
            env=allowed_variables(self.config, workdir, env),
            cwd=workdir,
            config=self.config,
            stdin=stdin,
            tree=hold_tree(self.config),
            setup=[die_with_parent, *limits, functools.partial(_no_privileges, self._capable)],
        )
