"""Process checks for tests that kill processes by PID."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody has reaped yet (an orphan is reaped by
    init, which in a container may not reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
