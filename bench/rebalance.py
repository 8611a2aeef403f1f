"""Rebalance times on the embedded broker (Tansu, over TCP) with rlbus's own subscribers: how long
a consumer group's partitions stand still when a member leaves, dies or joins.

Each member is a process (`rlbus.bus` BatchSubscriber, group "rebalance", kafka settings as
configured) printing every batch it handles; this process publishes one task to each
partition every 50 ms. With every member consuming, one event happens at t0:

- clean:   SIGTERM to a member (it finishes its batch, commits, leaves the group);
- sigkill: SIGKILL to a member (the broker notices when its session times out);
- join:    a third member starts (every partition is revoked and assigned again);
- static:  both members static (kafka.group_instance_id, session --static-session-ms), one
           SIGKILLed and restarted at once under the same id: when its partitions are consumed
           again (by it), and the longest gap in the other member's (which should not move).

Measured: for the partitions of the member that went, the time from t0 until each is consumed
again (by another member; by the restarted one for `static`); for `join` and `static`, the
longest gap in any partition's consumption after t0 (the other member's, for `static`).
Baseline, in the same run: the settings before this bench (aiokafka's defaults, session 10 s /
heartbeat 3 s, and no LeaveGroup in the group's first generation, which aiokafka leaves out on
Tansu). Each scenario has its own topics and group: Tansu keeps a group's session timeout from
the member that formed it.

    python bench/rebalance.py [--repeats 3] [--session-ms 2000] [--heartbeat-ms 500]
                              [--static-session-ms 10000]

Last line: RESULT clean_stop_s=<worst> sigkill_s=<worst> join_stall_s=<worst>
static_restart_s=<worst> static_other_gap_s=<worst> baseline_clean_stop_s=<worst>
baseline_sigkill_s=<worst> clean_stop_speedup=<baseline/now> sigkill_speedup=<baseline/now>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from rich.console import Console
from rich.table import Table

from rlbus.bus import Bus, Delivery, EmbeddedBroker
from rlbus.config import Settings, load_settings
from rlbus.schemas import TaskPublished, codec

console = Console()
GROUP = "rebalance"
PARTITIONS = 4
TICK_S = 0.05
"""One task to each partition this often: the resolution of every figure."""
SETTLE_S = 1.5
"""Every member has consumed within this window, and every partition: the group is stable."""


@dataclass(frozen=True)
class Setup:
    """How the members of a scenario are configured."""

    session_ms: int
    heartbeat_ms: int
    baseline: bool = False
    """The subscriber as it was before kafka.session_timeout_ms: no LeaveGroup of its own."""

    def __str__(self) -> str:
        text = f"session {self.session_ms} ms, heartbeat {self.heartbeat_ms} ms"
        return f"baseline: {text}" if self.baseline else text


BASELINE = Setup(10_000, 3_000, baseline=True)
"""aiokafka's defaults, which rlbus's subscribers used before kafka.session_timeout_ms."""


def member_settings(args: argparse.Namespace, prefix: str, instance: str = "") -> Settings:
    return load_settings(
        overrides={
            "run_id": "rebalance",
            "kafka": {
                "bootstrap_servers": args.bootstrap,
                "topic_prefix": prefix,
                "partitions": PARTITIONS,
                "session_timeout_ms": args.session_ms,
                "heartbeat_interval_ms": args.heartbeat_ms,
                "group_instance_id": instance,
            },
            "claim_check": {"url": f"file://{tempfile.gettempdir()}/rlbus-rebalance-claims"},
        }
    )


async def member(args: argparse.Namespace) -> None:
    """One group member: prints `{"m": name, "t": time, "p": [partitions]}` per batch handled,
    until SIGTERM."""
    if args.baseline:
        # The subscriber as it was: aiokafka alone decides whether to send LeaveGroup.
        from rlbus.bus import subscribers

        async def no_leave(consumer: object) -> None:
            return None

        subscribers.leave_first_generation = no_leave  # type: ignore[assignment]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    settings = member_settings(args, args.prefix, args.instance)

    async def handle(batch: list[Delivery]) -> None:
        line = {"m": args.member, "t": time.time(), "p": sorted({d.partition for d in batch})}
        print(json.dumps(line), flush=True)

    async with Bus.of(settings) as bus:
        await bus.subscriber("tasks", group=GROUP, batch=True)(handle).run(stop)


@dataclass
class Member:
    name: str
    proc: asyncio.subprocess.Process
    reader: asyncio.Task[None] | None = None


@dataclass
class Group:
    """The member processes of one scenario, and every batch they reported."""

    args: argparse.Namespace
    setup: Setup
    prefix: str
    """Topics and group of this scenario alone: Tansu keeps a group's session timeout from the
    member that formed it, for as long as it runs."""
    seen: list[tuple[str, float, int]] = field(default_factory=list)
    """(member, time, partition) of every batch handled."""
    members: dict[str, Member] = field(default_factory=dict)

    async def start(self, name: str, instance: str = "") -> None:
        a = self.args
        cmd = [sys.executable, __file__, "--member", name, "--bootstrap", a.bootstrap]
        cmd += ["--prefix", self.prefix, "--instance", instance]
        cmd += ["--session-ms", str(self.setup.session_ms)]
        cmd += ["--heartbeat-ms", str(self.setup.heartbeat_ms)]
        cmd += ["--baseline"] if self.setup.baseline else []
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        m = Member(name, proc)
        m.reader = asyncio.create_task(self._read(m))
        self.members[name] = m

    async def _read(self, m: Member) -> None:
        assert m.proc.stdout is not None
        async for raw in m.proc.stdout:
            line = json.loads(raw)
            self.seen.extend((m.name, line["t"], p) for p in line["p"])

    def owned(self, name: str, since: float) -> set[int]:
        return {p for m, t, p in self.seen if m == name and t >= since}

    async def stable(self, timeout_s: float = 120) -> None:
        """Until every member and every partition was consumed in the last SETTLE_S, twice."""
        deadline = time.time() + timeout_s
        streak = 0
        while streak < 2:
            if time.time() > deadline:
                raise TimeoutError(f"the group did not settle in {timeout_s:.0f}s")
            await asyncio.sleep(SETTLE_S)
            since = time.time() - SETTLE_S
            by = [self.owned(n, since) for n in self.members]
            covered = set().union(*by) == set(range(PARTITIONS))
            disjoint = sum(map(len, by)) == PARTITIONS
            streak = streak + 1 if covered and disjoint and all(by) else 0

    async def consumed_again(
        self, partitions: set[int], t0: float, by: set[str], timeout_s: float = 120
    ) -> float:
        """Seconds from t0 until each of `partitions` was consumed by one of `by` (the last)."""
        deadline = t0 + timeout_s
        while True:
            firsts = {}
            for m, t, p in self.seen:
                if t > t0 and m in by and p in partitions and p not in firsts:
                    firsts[p] = t
            if len(firsts) == len(partitions):
                return max(firsts.values()) - t0
            if time.time() > deadline:
                raise TimeoutError(f"partitions {sorted(partitions)} not consumed again")
            await asyncio.sleep(TICK_S)

    def longest_gap(self, t0: float, t1: float, partitions: set[int]) -> float:
        """The longest time any of `partitions` went unconsumed within [t0, t1]."""
        worst = 0.0
        for p in partitions:
            times = sorted(t for _, t, q in self.seen if q == p and t0 <= t <= t1)
            points = [t0, *times, t1]
            worst = max(worst, max(b - a for a, b in zip(points, points[1:], strict=False)))
        return worst

    async def stop(self) -> None:
        for m in self.members.values():
            if m.proc.returncode is None:
                m.proc.terminate()
        for m in self.members.values():
            try:
                await asyncio.wait_for(m.proc.wait(), 15)
            except TimeoutError:
                m.proc.kill()
                await m.proc.wait()
            if m.reader is not None:
                m.reader.cancel()


async def produce(bootstrap: str, prefix: str, stop: asyncio.Event) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    await producer.start()
    try:
        n = 0
        while not stop.is_set():
            for p in range(PARTITIONS):
                task = TaskPublished(task_id=f"t{n}", env="e", prompt="p", run_id="rebalance")
                await producer.send(prefix + "tasks", codec.encode(task), partition=p)
                n += 1
            await asyncio.sleep(TICK_S)
    finally:
        await producer.stop()


async def scenario(args: argparse.Namespace, kind: str, setup: Setup, n: int) -> dict[str, float]:
    """Run `n` of `kind`: its figures in seconds, by name (see the module's docstring)."""
    prefix = f"rb{os.getpid()}-{n}."
    async with Bus.of(member_settings(args, prefix)) as bus:
        await bus.ensure_topics(["tasks", "dlq"])
    group = Group(args, setup, prefix)
    stop = asyncio.Event()
    producing = asyncio.create_task(produce(args.bootstrap, prefix, stop))
    static = kind == "static"
    try:
        for i in range(2):
            await group.start(f"m{i}", f"m{i}" if static else "")
        await group.stable()
        t0 = time.time()
        gone = group.owned("m0", t0 - SETTLE_S)
        others = set(range(PARTITIONS)) - gone
        m0 = group.members["m0"].proc
        if kind == "clean":
            m0.terminate()
            return {kind: await group.consumed_again(gone, t0, {"m1"})}
        if kind == "sigkill":
            m0.kill()
            return {kind: await group.consumed_again(gone, t0, {"m1"})}
        if kind == "join":
            await group.start("m2")
            await group.stable()
            return {kind: group.longest_gap(t0, time.time(), set(range(PARTITIONS)))}
        m0.kill()  # static: restarted at once under the same instance id
        await m0.wait()
        await group.start("m0-again", "m0")
        back = await group.consumed_again(gone, t0, {"m0-again"})
        return {kind: back, "static, other member": group.longest_gap(t0, time.time(), others)}
    finally:
        await group.stop()
        stop.set()
        await producing


async def bench(args: argparse.Namespace) -> None:
    now = Setup(args.session_ms, args.heartbeat_ms)
    # A static member's restart must come back within its session, and Tansu holds its join
    # and its sync 3 s each: a session of a few seconds would take it out before it is back.
    static = Setup(args.static_session_ms, args.heartbeat_ms)
    runs = [("clean", now), ("sigkill", now), ("join", now), ("static", static)]
    runs += [("clean", BASELINE), ("sigkill", BASELINE)]
    figures: dict[tuple[str, Setup], list[float]] = {}
    with EmbeddedBroker() as broker:
        args.bootstrap = broker.bootstrap_servers
        for number, (kind, setup) in enumerate(runs):
            for i in range(args.repeats):
                got = await scenario(args, kind, setup, number * 100 + i)
                for name, s in got.items():
                    figures.setdefault((name, setup), []).append(s)
                    console.print(f"{name} ({setup}) #{i + 1}: {s:.2f}s")
    report(args, figures, now)


def report(
    args: argparse.Namespace, figures: dict[tuple[str, Setup], list[float]], now: Setup
) -> None:
    goals = {"clean": 5.0, "sigkill": now.session_ms / 1000 + 2}
    table = Table(title=f"partitions standing still (s), {args.repeats} runs each, 2 members")
    for col in ("event", "settings", "median", "worst", "goal"):
        table.add_column(col)
    for (kind, setup), values in figures.items():
        goal = f"<= {goals[kind]:.1f}" if setup == now and kind in goals else ""
        table.add_row(
            kind, str(setup), f"{statistics.median(values):.2f}", f"{max(values):.2f}", goal
        )
    console.print(table)
    load = os.getloadavg()[0]
    console.print(f"load average over 1 min at the end: {load:.2f} on {os.cpu_count()} cores")
    worst = {(kind, setup.baseline): max(values) for (kind, setup), values in figures.items()}
    print(
        f"RESULT clean_stop_s={worst[('clean', False)]:.2f} "
        f"sigkill_s={worst[('sigkill', False)]:.2f} "
        f"join_stall_s={worst[('join', False)]:.2f} "
        f"static_restart_s={worst[('static', False)]:.2f} "
        f"static_other_gap_s={worst[('static, other member', False)]:.2f} "
        f"baseline_clean_stop_s={worst[('clean', True)]:.2f} "
        f"baseline_sigkill_s={worst[('sigkill', True)]:.2f} "
        f"clean_stop_speedup={worst[('clean', True)] / worst[('clean', False)]:.1f} "
        f"sigkill_speedup={worst[('sigkill', True)] / worst[('sigkill', False)]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings().kafka
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--session-ms", type=int, default=defaults.session_timeout_ms)
    parser.add_argument("--heartbeat-ms", type=int, default=defaults.heartbeat_interval_ms)
    parser.add_argument("--static-session-ms", type=int, default=10_000)
    parser.add_argument("--member", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--instance", default="", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    asyncio.run(member(args) if args.member else bench(args))


if __name__ == "__main__":
    main()
