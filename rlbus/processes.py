"""Child processes of a local run: started with the parent's settings, logged to files,
stopped with SIGTERM (then SIGKILL) so each role can commit what it handled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rlbus.config import Settings, settings_env


class RoleProcess:
    """`python -m rlbus worker ROLE ...` with `settings` passed through the environment."""

    def __init__(self, role: str, settings: Settings, log_dir: Path, args: list[str] | None = None):
        self.role = role
        self.log_path = log_dir / f"{role}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **settings_env(settings), "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rlbus", "worker", role, *(args or [])],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def check(self) -> None:
        """Raise with the role's log tail if it has exited."""
        if not self.alive():
            raise RuntimeError(
                f"{self.role} exited with code {self.proc.returncode}; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: no chance to commit or flush (crash tests)."""
        self.proc.kill()
        self.proc.wait()


def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    processes: tuple[RoleProcess, ...] = (),
) -> None:
    """Poll `predicate()` until true; fail early when a process we depend on has died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in processes:
            p.check()
        if predicate():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
