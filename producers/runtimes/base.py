"""Where a rollout's programs run. A runtime hands each rollout a sandbox (its own working
directory, cleaned up afterwards) that runs argv with an environment and reports how it ended."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rlbus.config.env import RuntimeConfig
from rlbus.producers.runtimes.linux import PR_SET_PDEATHSIG, prctl
from rlbus.producers.runtimes.tree import Tree

TAIL = 4000
"""Characters of stdout/stderr kept in results and error messages."""
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


@dataclass
class ExecResult:
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    error_kind: str = ""
    """"" when the program exited 0; else timeout, memory, cpu, signal or exit."""
    error: str = ""
    peak_mb: float | None = None
    """The program tree's peak memory, where it was measured (cgroup or watchdog)."""
    cpu_s: float | None = None
    """CPU time of the program's whole tree, where it was measured (cgroup)."""


class RolloutEndpoint(Protocol):
    """A rollout's interception URL, for runtimes that give the program a network of its own."""

    @property
    def port(self) -> int:
        """The loopback port the program's URLs name."""
        ...

    def serving(self, listener: socket.socket) -> contextlib.AbstractAsyncContextManager[None]:
        """Serve this rollout on `listener`, a listening socket made for its program alone."""
        ...


@dataclass(frozen=True)
class Mount:
    """A path a rollout's programs see besides their working directory: the host's `source` at
    `target`, read-only unless `writable`; without a source, an empty read-only directory at
    `target` that hides whatever the program could otherwise read there."""

    target: str
    source: Path | None = None
    writable: bool = False


class Sandbox(Protocol):
    @property
    def workdir(self) -> Path: ...

    def mount(self, target: str, source: Path | None = None, *, writable: bool = False) -> None:
        """Show `source` at `target` (see Mount) to every later program run of this rollout; a
        runtime that cannot (subprocess, local) makes those runs fail, naming the mount."""
        ...

    async def run(
        self,
        argv: list[str],
        env: dict[str, str],
        stdin: bytes | None = None,
        *,
        readable: Sequence[Path] = (),
        endpoint: RolloutEndpoint | None = None,
    ) -> ExecResult:
        """Run argv to its end or its limits. `readable`: paths the program needs to read (a
        sandbox shows it nothing else of the host's files); `endpoint`: the rollout's URL (a
        sandbox lets the program reach nothing else)."""
        ...


class Runtime(Protocol):
    kind: str

    def sandbox(self, rollout_id: str) -> contextlib.AbstractAsyncContextManager[Sandbox]: ...


def cpu_limit(cpu_s: int) -> Callable[[], None]:
    def apply() -> None:  # in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))

    return apply


def die_with_parent() -> None:
    """In the child: SIGKILL when this process dies, so a crashed producer leaves no program."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def allowed_variables(config: RuntimeConfig, home: Path, env: dict[str, str]) -> dict[str, str]:
    """`keep_env` from this process's environment (nothing else of it), HOME and TMPDIR in the
    rollout's directory, then what the harness sets."""
    kept = {k: os.environ[k] for k in config.keep_env if k in os.environ}
    return {**kept, "HOME": str(home), "TMPDIR": str(home), **env}


def _classify(
    code: int | None,
    stderr: str,
    config: RuntimeConfig,
    timed_out: bool,
    tree: Tree | None,
    tree_over_memory: bool,
) -> tuple[str, str]:
    limit = f"{config.timeout_s:g}s"
    if timed_out:
        return "timeout", f"killed after exceeding its {limit} time limit"
    if code == 0:
        return "", ""
    if config.memory_mb is not None:
        if tree is not None and tree_over_memory:
            return "memory", (
                f"exceeded its {config.memory_mb} MiB memory limit (the whole process tree, "
                f"held by {tree.kind}; exit {code})"
            )
        # Without a tree (docker) the signs are the program's own words or a kill.
        if any(s in stderr for s in _MEMORY_SIGNS) or (
            tree is None and code in (-signal.SIGKILL, 137)
        ):
            return "memory", f"exceeded its {config.memory_mb} MiB memory limit (exit {code})"
    if config.cpu_s is not None and code in (
        -signal.SIGXCPU,
        -signal.SIGKILL,
        128 + signal.SIGXCPU,
    ):
        return "cpu", f"exceeded its {config.cpu_s} CPU-second limit (exit {code})"
    if code is not None and code < 0:
        return "signal", f"killed by signal {signal.Signals(-code).name}"
    return "exit", f"exited with code {code}"


async def _drain(stream: asyncio.StreamReader | None, into: bytearray) -> None:
    while stream is not None and (chunk := await stream.read(1 << 16)):
        into.extend(chunk)
        if len(into) > 4 * TAIL:
            del into[:-TAIL]  # only the tail is ever reported


async def run_process(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    config: RuntimeConfig,
    stdin: bytes | None = None,
    tree: Tree | None = None,
    setup: Sequence[Callable[[], None]] = (),
    pass_fds: Sequence[int] = (),
    on_timeout: Callable[[], Awaitable[object]] | None = None,
) -> ExecResult:
    """Run argv in its own session; on timeout, and whenever it ends, kill its process group
    and (with a `tree`) every process of its tree, then release the tree. `setup` runs in the
    child between fork and exec, after it joined the tree."""
    steps = [*([tree.preexec] if tree is not None else []), *setup]

    def preexec() -> None:
        for step in steps:
            step()

    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec if steps else None,
            pass_fds=pass_fds,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        if tree is not None:
            await tree.close()
        return ExecResult(None, "", str(exc), 0.0, "exit", f"cannot start {argv[0]!r}: {exc}")
    if tree is not None:
        tree.started(proc)
    out, err = bytearray(), bytearray()
    # Read as it comes, so what a program printed before being killed is still reported.
    readers = asyncio.gather(_drain(proc.stdout, out), _drain(proc.stderr, err))
    timed_out = False
    try:
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(stdin or b"")
                await proc.stdin.drain()
            proc.stdin.close()
        await asyncio.wait_for(proc.wait(), config.timeout_s)
    except TimeoutError:
        timed_out = True
        if on_timeout is not None:
            await on_timeout()
    finally:
        # Whatever the program left running goes with it: its whole tree (first, while the
        # program still holds its orphans), and its process group.
        if tree is not None:
            await tree.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        try:
            await asyncio.wait_for(readers, 5)
        except TimeoutError:
            readers.cancel()  # something outside the tree still holds the pipes
        over, peak, cpu = False, None, None
        if tree is not None:
            over, peak, cpu = tree.memory_exceeded(), tree.peak_mb(), tree.cpu_s()
            await tree.close()
    stdout, stderr = out.decode(errors="replace")[-TAIL:], err.decode(errors="replace")[-TAIL:]
    kind, message = _classify(proc.returncode, stderr, config, timed_out, tree, over)
    if kind and stderr.strip():
        message += f"; stderr tail:\n{stderr[-1500:]}"
    return ExecResult(
        proc.returncode,
        stdout,
        stderr,
        time.monotonic() - started,
        kind,
        f"{argv[0]} {message}" if kind else "",
        peak,
        cpu,
    )


class Workdir:
    """A rollout's working directory, made on first use: chat harnesses never need one, and
    making and removing a directory per rollout costs more than a fast model call."""

    def __init__(self, rollout_id: str, keep: bool):
        self._prefix = f"rlbus-{rollout_id[:8]}-"
        self._keep = keep
        self._path: Path | None = None

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = Path(tempfile.mkdtemp(prefix=self._prefix))
        return self._path

    def remove(self) -> None:
        if self._path is not None and not self._keep:
            shutil.rmtree(self._path, ignore_errors=True)


@contextlib.asynccontextmanager
async def workdir(rollout_id: str, keep: bool) -> AsyncIterator[Workdir]:
    directory = Workdir(rollout_id, keep)
    try:
        yield directory
    finally:
        directory.remove()


@dataclass
class RolloutSandbox:
    """What a harness gets: the rollout's directory, and `run` through its runtime."""

    directory: Workdir
    runtime: ProcessRuntime
    mounts: list[Mount] = field(default_factory=list)

    @property
    def workdir(self) -> Path:
        return self.directory.path

    def mount(self, target: str, source: Path | None = None, *, writable: bool = False) -> None:
        self.mounts.append(Mount(target, source, writable))

    async def run(
        self,
        argv: list[str],
        env: dict[str, str],
        stdin: bytes | None = None,
        *,
        readable: Sequence[Path] = (),
        endpoint: RolloutEndpoint | None = None,
    ) -> ExecResult:
        # Passed only when there are some: a runtime written before mounts still runs the rest.
        extra = {"mounts": tuple(self.mounts)} if self.mounts else {}
        return await self.runtime.launch(
            self.workdir, argv, env, stdin, readable, endpoint, **extra
        )


class ProcessRuntime:
    """A runtime whose rollouts each get a working directory and run programs by `launch`."""

    kind = ""

    def __init__(self, config: RuntimeConfig):
        self.config = config

    @contextlib.asynccontextmanager
    async def sandbox(self, rollout_id: str) -> AsyncIterator[RolloutSandbox]:
        async with workdir(rollout_id, self.config.keep_workdir) as directory:
            yield RolloutSandbox(directory, self)

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
        raise NotImplementedError


def refuse_mounts(kind: str, mounts: Sequence[Mount]) -> ExecResult | None:
    """The failed run of a runtime that shows programs the host as it is (no mount namespace):
    a program that was promised a mount must not run without it."""
    if not mounts:
        return None
    where = ", ".join(m.target for m in mounts)
    return ExecResult(
        None,
        "",
        "",
        0.0,
        "exit",
        f"the {kind} runtime cannot mount {where} for this program (it has no mount namespace); "
        'use runtime.kind = "sandbox" or "docker"',
    )
