"""CPU seconds spent by this process and by other live processes, for benchmarks that report CPU
per rollout (on a shared machine, load inflates wall time far more than CPU time)."""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

import numpy as np


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


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and all its descendants, live or finished: each live process's
    own time plus what its finished (reaped) children used. ProcessLookupError once `pid` is
    gone."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        stats[int(entry.name)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    if pid not in stats:
        raise ProcessLookupError(pid)
    ticks, todo = 0, [pid]
    while todo:
        current = todo.pop()
        if (fields := stats.get(current)) is not None:
            ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        todo += children.get(current, [])
    return ticks / os.sysconf("SC_CLK_TCK")


class TreeCpuSampler:
    """Samples (wall time, tree_cpu(pid)) every `every_s` on a thread, so the CPU a process tree
    spent inside a window known only afterwards (e.g. from its own timestamps) can be read."""

    def __init__(self, pid: int, every_s: float = 0.1):
        self.pid = pid
        self.every_s = every_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), tree_cpu(self.pid)))
            except ProcessLookupError:
                return  # it has exited: what it spent before is sampled
            self._stop.wait(self.every_s)

    def __enter__(self) -> TreeCpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> float:
        """CPU seconds spent between two wall times (linear between samples)."""
        times = [t for t, _ in self.samples]
        cpus = [c for _, c in self.samples]
        return float(np.interp(end, times, cpus) - np.interp(start, times, cpus))
