"""rlbus's side of a hosted environment's worker (host.py, run by the environment's own venv):
start it, ask it things, and notice when it dies or hangs.

One process serves a whole environment (many rollouts at once, not one process per rollout).
Requests are answered by a reader thread, so the same worker serves the synchronous callers
(describe, task rows, which the loader and task streams ask for outside any event loop) and the
rollouts' coroutines. A worker that exits fails every request in flight with its exit code and
the tail of its stderr; the next request starts a new one. A worker that does not answer a ping
after a rollout was cancelled is hung: it is killed, and its requests fail saying so."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbus.environment.hosted.venvs import passed_environment

HOST = Path(__file__).resolve().parent / "host.py"
STDERR_TAIL = 40
"""Lines of a worker's stderr kept for the error that reports its death."""


def _running(process: subprocess.Popen[bytes]) -> bool:
    """Whether the worker still runs. poll() answers None while another thread waits on the
    process (the reader thread, as it exits), so then the process table decides: a zombie or
    a reaped process has exited (CI once got a killed worker's description back)."""
    if process.poll() is not None:
        return False
    try:
        stat = Path(f"/proc/{process.pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class HostedWorkerError(RuntimeError):
    """A request a hosted environment's worker could not answer; the message names the
    environment and what failed."""


@dataclass(frozen=True)
class WorkerSpec:
    """How to start an environment's worker."""

    env: str
    """The environment's spec as the user wrote it (named in every error)."""
    python: Path
    """The interpreter of the venv it is installed in."""
    kind: str
    """The adapter (host.py's KINDS)."""
    target: str
    """What the adapter loads (a module, a game, an OpenEnv package)."""
    args: dict[str, Any]
    load_timeout_s: float = 300
    hang_check_s: float = 10
    """How long a worker may take to answer a ping after one of its rollouts was cancelled."""


class HostedWorker:
    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.described: dict[str, Any] = {}
        self._lock = threading.Lock()
        """Guards the requests in flight (the reader thread answers them)."""
        self._starting = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count(1)
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)

    # -- the process ---------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        """Start the worker (if it is not running) and return what its adapter described."""
        with self._starting:
            if self._process is not None and _running(self._process):
                return self.described
            self._start()
            return self.described

    def _start(self) -> None:
        spec = self.spec
        if not spec.python.exists():
            raise HostedWorkerError(f"environment {spec.env}: no interpreter {spec.python}")
        argv = [str(spec.python), str(HOST), spec.kind, spec.target, json.dumps(spec.args)]
        # The environment's code sees none of rlbus's settings or secrets (docs/architecture.md,
        # trust boundaries): only what venv and pip see.
        env = {**passed_environment(), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        self._stderr.clear()
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=os.getcwd(),
            start_new_session=True,
        )
        first: Future[Any] = Future()
        with self._lock:
            self._pending = {0: first}
            self._process = process
        threading.Thread(target=self._read_stderr, args=(process,), daemon=True).start()
        threading.Thread(target=self._read_replies, args=(process,), daemon=True).start()
        try:
            self.described = first.result(timeout=spec.load_timeout_s)
        except FutureTimeout:
            self._kill(f"did not load within {spec.load_timeout_s:g}s")
            raise HostedWorkerError(
                f"environment {spec.env}: its worker did not load within "
                f"{spec.load_timeout_s:g}s{self._tail()}"
            ) from None
        except HostedWorkerError as exc:
            raise HostedWorkerError(f"environment {spec.env} failed to load: {exc}") from None

    def _read_stderr(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip()
            self._stderr.append(line)
            print(f"[{self.spec.env}] {line}", file=sys.stderr)

    def _read_replies(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            try:
                reply = json.loads(raw)
            except ValueError:
                continue
            with self._lock:
                future = self._pending.pop(reply.get("id", -1), None)
            if future is None or future.done():
                continue
            if reply.get("ok"):
                future.set_result(reply.get("result"))
            else:
                future.set_exception(HostedWorkerError(str(reply.get("error"))))
        code = process.wait()
        self._fail_pending(process, f"its worker exited with code {code}")

    def _fail_pending(
        self, process: subprocess.Popen[bytes], why: str, detach: bool = True
    ) -> None:
        """Fail the requests in flight on `process` with `why`; `detach` forgets the process
        too (the next request starts a new one)."""
        with self._lock:
            if self._process is not process:
                return
            pending, self._pending = self._pending, {}
            if detach:
                self._process = None
        error = HostedWorkerError(f"environment {self.spec.env}: {why}{self._tail()}")
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    def _tail(self) -> str:
        lines = list(self._stderr)[-12:]
        return ("; its stderr ended:\n" + "\n".join(lines)) if lines else ""

    def _kill(self, why: str) -> None:
        process = self._process
        if process is None:
            return
        try:
            os.killpg(process.pid, 9)
        except ProcessLookupError:
            pass
        why = f"its worker {why} and was killed"
        self._fail_pending(process, why, detach=False)
        # Detached only once reaped: SIGKILL lands asynchronously, and a caller that saw the
        # worker gone could otherwise still find it in the process table (CI did).
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._fail_pending(process, why)

    def close(self) -> None:
        """End the worker: closing its stdin lets it cancel its requests and close the
        adapter; one that does not exit within 10 s is killed."""
        process = self._process
        if process is None:
            return
        assert process.stdin is not None
        try:
            process.stdin.close()
            process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._kill("did not exit within 10 s of being closed")

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None else None

    # -- requests ------------------------------------------------------------------------

    def request(self, op: str, **params: Any) -> tuple[int, Future[Any]]:
        """Send one request (starting the worker if needed); its id and its reply's future."""
        self.start()
        future: Future[Any] = Future()
        with self._lock:
            process = self._process
            rid = next(self._ids)
            self._pending[rid] = future
        line = json.dumps({"id": rid, "op": op, "params": params}) + "\n"
        try:
            assert process is not None and process.stdin is not None
            process.stdin.write(line.encode())
            process.stdin.flush()
        except (OSError, AssertionError):
            with self._lock:
                self._pending.pop(rid, None)
            raise HostedWorkerError(
                f"environment {self.spec.env}: its worker is gone{self._tail()}"
            ) from None
        return rid, future

    def call(self, op: str, timeout: float | None = None, **params: Any) -> Any:
        """A request, waited for here (outside an event loop)."""
        _, future = self.request(op, **params)
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            raise HostedWorkerError(
                f"environment {self.spec.env}: {op} got no answer within {timeout:g}s"
            ) from None

    async def acall(self, op: str, **params: Any) -> Any:
        """A request, awaited. Cancelled (a rollout's time limit), it is cancelled in the worker
        too, and a worker that then does not answer a ping is killed as hung."""
        process = self._process
        if process is not None and process.poll() is None:
            rid, future = self.request(op, **params)
        else:  # starting it waits for it to load: not on the event loop
            rid, future = await asyncio.to_thread(self.request, op, **params)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self._cancelled(rid)
            raise

    def _cancelled(self, rid: int) -> None:
        process = self._process
        if process is None or process.stdin is None:
            return
        try:
            cancel = {"id": next(self._ids), "op": "cancel", "params": {"target": rid}}
            process.stdin.write((json.dumps(cancel) + "\n").encode())
            process.stdin.flush()
        except OSError:
            return
        threading.Thread(target=self._check_alive, args=(process,), daemon=True).start()

    def _check_alive(self, process: subprocess.Popen[bytes]) -> None:
        try:
            _, pong = self.request("ping")
            pong.result(timeout=self.spec.hang_check_s)
        except FutureTimeout:
            if self._process is process:
                self._kill(f"did not answer a ping within {self.spec.hang_check_s:g}s (hung)")
        except HostedWorkerError:
            pass
