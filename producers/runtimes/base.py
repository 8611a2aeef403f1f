"""Where a rollout's programs run. A runtime hands each rollout a sandbox (its own working
directory, cleaned up afterwards) that runs argv with an environment and reports how it ended."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rlbus.config.env import RuntimeConfig

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


class Sandbox(Protocol):
    workdir: Path

    async def run(
        self, argv: list[str], env: dict[str, str], stdin: bytes | None = None
    ) -> ExecResult: ...


class Runtime(Protocol):
    kind: str

    def sandbox(self, rollout_id: str) -> contextlib.AbstractAsyncContextManager[Sandbox]: ...


def _limits(memory_mb: int | None, cpu_s: int | None) -> Callable[[], None] | None:
    if memory_mb is None and cpu_s is None:
        return None

    def apply() -> None:  # runs in the child between fork and exec
        if memory_mb is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        if cpu_s is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))

    return apply


def _classify(
    code: int | None, stderr: str, config: RuntimeConfig, timed_out: bool
) -> tuple[str, str]:
    limit = f"{config.timeout_s:g}s"
    if timed_out:
        return "timeout", f"killed after exceeding its {limit} time limit"
    if code == 0:
        return "", ""
    if config.memory_mb is not None and (
        any(s in stderr for s in _MEMORY_SIGNS) or code in (-signal.SIGKILL, 137)
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
    limited: bool = False,
    on_timeout: Callable[[], Awaitable[object]] | None = None,
) -> ExecResult:
    """Run argv in its own process group; on timeout kill the whole group. `limited` applies the
    config's memory and CPU limits to the process itself (the docker runtime passes them to the
    container instead)."""
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
            preexec_fn=_limits(config.memory_mb, config.cpu_s) if limited else None,
        )
    except OSError as exc:
        return ExecResult(None, "", str(exc), 0.0, "exit", f"cannot start {argv[0]!r}: {exc}")
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
        # Whatever the program left running in its group goes with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        try:
            await asyncio.wait_for(readers, 5)
        except TimeoutError:
            readers.cancel()  # something outside the group still holds the pipes
    stdout, stderr = out.decode(errors="replace")[-TAIL:], err.decode(errors="replace")[-TAIL:]
    kind, message = _classify(proc.returncode, stderr, config, timed_out)
    if kind and stderr.strip():
        message += f"; stderr tail:\n{stderr[-1500:]}"
    return ExecResult(
        proc.returncode,
        stdout,
        stderr,
        time.monotonic() - started,
        kind,
        f"{argv[0]} {message}" if kind else "",
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
