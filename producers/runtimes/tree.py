"""A program's whole process tree, held so it is bounded and killed as one.

`Cgroup`, where this host lets this process make cgroups (v2 with the memory controller
delegated to our cgroup, or the v1 memory hierarchy): the program's first process joins a cgroup
of its own before exec, so every descendant is in it whatever it does (setsid, double fork); the
memory, pids and CPU limits hold for the tree, the kill takes every member, and the tree's CPU
time and peak memory are measured.

`Watched`, elsewhere: an address-space limit per process, the first process made the subreaper
of its descendants, and a watchdog that sums the tree's RSS every 100 ms and kills the whole
tree when it is over the limit. Weaker: the tree may overshoot for up to one interval, and a
descendant that outlives the first process is no longer found (the sandbox's PID namespace
closes that gap: its processes all die with it)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import resource
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rlbus.config.env import RuntimeConfig
from rlbus.producers.runtimes.linux import PR_SET_CHILD_SUBREAPER, prctl

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.1
"""How often the watchdog sums a tree's RSS (no cgroup)."""
_KILL_ROUNDS = 200
_names = itertools.count()
_PAGE = os.sysconf("SC_PAGE_SIZE")


class Tree(Protocol):
    kind: str
    """How the tree is held, for messages: "cgroup v1", "cgroup v2" or "watchdog"."""

    def preexec(self) -> None:
        """Runs in the program's first process between fork and exec."""

    def started(self, proc: asyncio.subprocess.Process) -> None: ...

    async def kill(self) -> None:
        """SIGKILL every process of the tree."""

    def memory_exceeded(self) -> bool: ...

    def peak_mb(self) -> float | None: ...

    def cpu_s(self) -> float | None:
        """CPU time the whole tree used, where measured (a cgroup)."""

    async def close(self) -> None:
        """Kill what is left and release what holds the tree."""


@dataclass(frozen=True)
class CgroupHost:
    version: int
    parents: dict[str, Path]
    """This process's own cgroup directory per usable controller (memory, pids, cpu, cpuacct)."""


def _own_cgroups() -> dict[str, str]:
    """Our cgroup path per v1 controller; "" for the v2 hierarchy."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _cgroup_mounts() -> list[tuple[str, Path, str, set[str]]]:
    """(fs type, mount point, hierarchy root, super options) of every cgroup mount."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        rest = fields[fields.index("-") + 1 :]
        if rest[0] in ("cgroup", "cgroup2"):
            mounts.append((rest[0], Path(fields[4]), fields[3], set(rest[2].split(","))))
    return mounts


def _usable(mount: Path, root: str, own: str | None) -> Path | None:
    """Our own cgroup's directory under `mount`, when we may make cgroups in it."""
    if own is None or not (own == root or own.startswith(root.rstrip("/") + "/")):
        return None
    directory = mount / own[len(root) :].lstrip("/")
    probe = directory / f"rlbus-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    return directory


@functools.cache
def cgroup_host() -> CgroupHost | None:
    """Where this process may make cgroups for its programs, found once; None when nowhere."""
    own = _own_cgroups()
    mounts = _cgroup_mounts()
    for fstype, mount, root, _ in mounts:
        directory = _usable(mount, root, own.get("")) if fstype == "cgroup2" else None
        if directory is not None:
            enabled = (directory / "cgroup.subtree_control").read_text().split()
            if "memory" in enabled:
                # cpu.stat's usage is there whatever is enabled: cpuacct is that in v2.
                wanted = [c for c in ("memory", "pids", "cpu") if c in enabled]
                return CgroupHost(2, {c: directory for c in [*wanted, "cpuacct"]})
    parents: dict[str, Path] = {}
    for fstype, mount, root, options in mounts:
        for controller in ("memory", "pids", "cpu", "cpuacct"):
            if fstype == "cgroup" and controller in options and controller not in parents:
                directory = _usable(mount, root, own.get(controller))
                if directory is not None:
                    parents[controller] = directory
    return CgroupHost(1, parents) if "memory" in parents else None


def describe_trees() -> str:
    """One line saying how program trees are held here, for the log."""
    host = cgroup_host()
    if host is None:
        return (
            "no cgroup this process may create: memory limits are per process (RLIMIT_AS) plus "
            f"a watchdog on each program tree's RSS every {WATCH_INTERVAL_S:g}s"
        )
    return f"program trees held by cgroup v{host.version} ({', '.join(sorted(host.parents))})"


def _read_int(path: Path, key: str | None = None) -> int | None:
    """The number in a cgroup file, or the value of `key` in a "key value" file."""
    try:
        text = path.read_text()
    except OSError:
        return None
    if key is None:
        return int(text.split()[0])
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None


class Cgroup:
    """A cgroup per program run (one per v1 hierarchy), removed when the run ends."""

    def __init__(self, host: CgroupHost, config: RuntimeConfig):
        self.version = host.version
        self.kind = f"cgroup v{host.version}"
        self.limited = config.memory_mb is not None
        name = f"rlbus-{os.getpid()}-{next(_names)}"
        wanted = {
            "memory": True,
            "pids": config.pids_max is not None,
            "cpu": bool(config.cpus),
            "cpuacct": True,
        }
        self.dirs: dict[str, Path] = {}
        try:
            for controller, parent in host.parents.items():
                if wanted[controller]:
                    directory = parent / name  # v2: one directory for every controller
                    if directory not in self.dirs.values():
                        directory.mkdir()
                    self.dirs[controller] = directory
            self._limit(config)
        except OSError:
            self._remove()
            raise
        self.main = self.dirs["memory"]
        self._procs = [os.fsencode(d / "cgroup.procs") for d in set(self.dirs.values())]

    def _limit(self, config: RuntimeConfig) -> None:
        memory, pids, cpu = (self.dirs.get(c) for c in ("memory", "pids", "cpu"))
        v2 = self.version == 2
        if config.memory_mb is not None and memory is not None:
            size = str(config.memory_mb << 20)
            (memory / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(size)
            # No swap for the tree, so the limit is the tree's memory (memsw is memory + swap).
            swap = memory / ("memory.swap.max" if v2 else "memory.memsw.limit_in_bytes")
            if swap.exists():
                swap.write_text("0" if v2 else size)
        if config.pids_max is not None and pids is not None:
            (pids / "pids.max").write_text(str(config.pids_max))
        if config.cpus and cpu is not None:
            period = 100_000 if v2 else _read_int(cpu / "cpu.cfs_period_us") or 100_000
            quota = max(1000, int(config.cpus * period))
            if v2:
                (cpu / "cpu.max").write_text(f"{quota} {period}")
            else:
                (cpu / "cpu.cfs_quota_us").write_text(str(quota))

    def preexec(self) -> None:
        for procs in self._procs:  # "0": the writing process itself
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def started(self, proc: asyncio.subprocess.Process) -> None:
        pass

    def members(self) -> list[int]:
        try:
            return [int(p) for p in (self.main / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    async def kill(self) -> None:
        if self.version == 2 and (self.main / "cgroup.kill").exists():
            (self.main / "cgroup.kill").write_text("1")
        # v1 has no cgroup.kill: kill whatever is listed until nothing is (forks race the loop).
        for _ in range(_KILL_ROUNDS):
            members = self.members()
            if not members:
                return
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.005)
        log.warning("processes left in %s after %d kill rounds", self.main, _KILL_ROUNDS)

    def memory_exceeded(self) -> bool:
        if not self.limited:
            return False
        events = self.main / ("memory.events" if self.version == 2 else "memory.oom_control")
        return (_read_int(events, "oom_kill") or 0) > 0

    def peak_mb(self) -> float | None:
        peak = _read_int(
            self.main / ("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")
        )
        return None if peak is None else peak / (1 << 20)

    def cpu_s(self) -> float | None:
        accounted = self.dirs.get("cpuacct")
        if accounted is None:
            return None
        if self.version == 2:
            used = _read_int(accounted / "cpu.stat", "usage_usec")
            return None if used is None else used / 1e6
        used = _read_int(accounted / "cpuacct.usage")
        return None if used is None else used / 1e9

    def _remove(self) -> list[Path]:
        left = []
        for directory in set(self.dirs.values()):
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(directory)
        return left

    async def close(self) -> None:
        await self.kill()
        for _ in range(100):  # exiting members leave the cgroup a moment after their kill
            if not self._remove():
                return
            await asyncio.sleep(0.01)
        log.warning("could not remove cgroups %s", [str(d) for d in self.dirs.values()])


def descendants(root: int) -> list[int]:
    """Every live process below `root`, from one scan of /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, frontier = [], [root]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class Watched:
    """No cgroup: per-process address-space limit, subreaper, and an RSS watchdog."""

    kind = "watchdog"

    def __init__(self, config: RuntimeConfig):
        self.limit = None if config.memory_mb is None else config.memory_mb << 20
        self.proc: asyncio.subprocess.Process | None = None
        self.exceeded = False
        self.peak = 0
        self._watch: asyncio.Task[None] | None = None

    def preexec(self) -> None:
        if self.limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (self.limit, self.limit))
        # Orphans below the program are re-parented to it, not to init, so they stay found.
        prctl(PR_SET_CHILD_SUBREAPER, 1)

    def started(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        if self.limit is not None:
            self._watch = asyncio.get_running_loop().create_task(self._watching(proc, self.limit))

    async def _watching(self, proc: asyncio.subprocess.Process, limit: int) -> None:
        while proc.returncode is None:
            rss = sum(_rss(pid) for pid in [proc.pid, *descendants(proc.pid)])
            self.peak = max(self.peak, rss)
            if rss > limit:
                self.exceeded = True
                await self.kill()
                return
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def kill(self) -> None:
        proc = self.proc
        if proc is None:
            return
        # Below first: while the first process lives, orphans are re-parented to it and found.
        for _ in range(_KILL_ROUNDS):
            below = descendants(proc.pid) if proc.returncode is None else []
            if not below:
                break
            for pid in below:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.005)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()  # a no-op once it was reaped, so never another process's PID

    def memory_exceeded(self) -> bool:
        return self.exceeded

    def peak_mb(self) -> float | None:
        return self.peak / (1 << 20) if self._watch is not None else None

    def cpu_s(self) -> float | None:
        return None

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.kill()


def hold_tree(config: RuntimeConfig) -> Tree:
    """How the next program run's tree is held: its own cgroup where possible."""
    host = cgroup_host()
    if host is not None:
        try:
            return Cgroup(host, config)
        except OSError as exc:
            log.warning("cannot make a cgroup for a program (%s); using the watchdog", exc)
    return Watched(config)
