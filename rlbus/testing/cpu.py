"""CPU seconds spent by this process and by other live processes, for benchmarks that report CPU
per rollout (on a shared machine, load inflates wall time far more than CPU time)."""

from __future__ import annotations

import os
import resource
from pathlib import Path


def own_cpu() -> float:
    """User + system CPU seconds of this process (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a live process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds of this process and of named live processes between `start` and `stop`."""

    def __init__(self, **pids: int):
        self.pids = pids
        self._started: dict[str, float] = {}
        self.used: dict[str, float] = {}
        """Seconds by part ("this process" and each named pid), after `stop`."""

    def _now(self) -> dict[str, float]:
        return {"this process": own_cpu(), **{k: cpu_of(p) for k, p in self.pids.items()}}

    def start(self) -> CpuMeter:
        self._started = self._now()
        return self

    def stop(self) -> dict[str, float]:
        self.used = {k: v - self._started[k] for k, v in self._now().items()}
        return self.used

    @property
    def total(self) -> float:
        return sum(self.used.values())
