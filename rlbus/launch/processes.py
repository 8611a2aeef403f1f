"""Child processes of a local run: started with the parent's settings, logged to files,
stopped with SIGTERM (then SIGKILL) so each role can commit what it handled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rlbus.config import Settings, settings_env


class RoleProcess:
    """`python -m rlbus worker ROLE ...` with `settings` passed through the environment."""

    def __init__(
        self,
        role: str,
        settings: Settings,
        log_dir: Path,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ):
        """`env`: more environment variables for the role (its thread counts)."""
        self.role = role
        self.args = list(args or [])
        self.log_path = log_dir / f"{role}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._env = {
            **os.environ,
            **settings_env(settings),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "rlbus", "worker", self.role, *self.args],
                env=self._env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def restart(self, *extra_args: str) -> None:
        """Start the role again, after it exited or was killed (`extra_args` added, once)."""
        if self.alive():
            raise RuntimeError(f"{self.role} (process {self.proc.pid}) is still running")
        self.args += [a for a in extra_args if a not in self.args]
        self.proc = self._spawn()

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


def alive(*processes: RoleProcess) -> Callable[[], None]:
    """A `check` for bus.waiting.wait_for: fail early, with its log tail, when one has died."""

    def check() -> None:
        for process in processes:
            process.check()

    return check
