"""Child processes of a local run: started with the parent's settings, logged to files,
stopped with SIGTERM (then SIGKILL) so each role can commit what it handled."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rlbus.config import Settings, settings_variables
from rlbus.producers.runtimes.linux import PR_SET_PDEATHSIG, prctl
from rlbus.producers.runtimes.tree import descendants

MEMORY_SETTINGS = {
    "trainer": "trainer.micro_batch_tokens (the trainer logs its memory estimate; "
    "trainer.gradient_checkpointing also helps)",
    "inference": "the rollouts running at once (max_concurrent_rollouts of the envs)",
}
"""What to lower when a role runs out of memory."""

KILL_AFTER_S = 15.0
"""How long a role has to stop after SIGTERM before it and the processes it started are killed."""


def _stop_with_launcher() -> None:
    """In the role's process, before exec: SIGTERM when the process that started it dies, however
    it dies (SIGKILL, OOM). A role outliving its launcher would run on for good against the
    launcher's embedded broker, which dies with it; SIGTERM lets it commit what it handled."""
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def rss_bytes(pid: int) -> int | None:
    """A process's resident memory (VmRSS), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    return None


def exit_reason(role: str, code: int | None) -> str:
    """How a role's exit reads: a SIGKILL nobody sent here is most often the kernel's OOM
    killer, and a bare "-9" says nothing of that."""
    if code != -signal.SIGKILL:
        return f"{role} exited with code {code}"
    hint = f": lower {MEMORY_SETTINGS[role]}" if role in MEMORY_SETTINGS else ""
    return f"{role} was killed (SIGKILL, likely out of memory){hint}"


class RoleProcess:
    """`python -m rlbus worker ROLE ...` with `settings` passed through the environment."""

    def __init__(
        self,
        role: str,
        settings: Settings,
        log_dir: Path,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        name: str = "",
    ):
        """`env`: more environment variables for the role (its thread counts); `name`: of its
        log file (default: the role), so that each of several processes of a role has its own."""
        self.role = role
        self.name = name or role
        """What the run calls this process (env-2), in its log's name and its health samples."""
        self.args = list(args or [])
        self.log_path = log_dir / f"{self.name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._env = {
            **os.environ,
            **settings_variables(settings),
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
                preexec_fn=_stop_with_launcher,
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
                f"{exit_reason(self.role, self.proc.returncode)}; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def terminate(self) -> None:
        """SIGTERM: the role finishes what it handles, commits, and exits."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def wait_or_kill(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for the role to exit, then kill it and everything it started."""
        try:
            self.proc.wait(max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            self.kill()
        return self.proc.returncode

    def stop(self, timeout_s: float = KILL_AFTER_S) -> int:
        self.terminate()
        return self.wait_or_kill(timeout_s)

    def kill(self) -> None:
        """SIGKILL the role and every process it started, as a crashed container's all die: no
        chance to commit or flush (crash tests). (vLLM's engine processes outlive a parent
        killed alone, holding their memory.)"""
        below = descendants(self.proc.pid)
        self.proc.kill()
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()


def alive(*processes: RoleProcess) -> Callable[[], None]:
    """A `check` for bus.waiting.wait_for: fail early, with its log tail, when one has died."""

    def check() -> None:
        for process in processes:
            process.check()

    return check
