"""Soak: an RL run of a tiny model plus a steady eval stream for an hour (or --minutes), every
role a process on the embedded broker, sampled every minute for what grows.

1. `rlbus run`'s roles (examples/reverse_text/rl.toml on a `rlbus model init` model, max_steps
   out of reach): sink, inference, trainer, orchestrator, env producer, judge;
2. an eval run beside it: `rlbus worker env` and `rlbus worker judge` on examples/reverse_text
   against a scripted model server, fed --eval-tasks-per-s tasks a second by this process;
3. every --sample-s: each process's RSS and open files (the roles, the eval's roles, Tansu),
   the store's bytes per table (system.parts, ClickHouse's own system tables included), the
   claim store's and the checkpoints' bytes, every consumer group's lag (end offsets minus
   committed offsets), and rollouts stored per run (rollouts/s between samples).

4. when Tansu holds more than --broker-max-mb (kafka.embedded_max_rss_mb; checked at each
   sample, at most once a minute), or at the minutes of --handover-at, the broker is handed
   over as `rlbus run` does it (every role stopped, the unfinished messages carried to a fresh
   broker, every role resumed; the eval run stopped and started around it): its RSS is then a
   sawtooth under the limit, and each handover's pause is listed. A role's RSS series goes on
   across its restarts.

After --warmup-minutes each series' least-squares slope is printed. The samples are written
as they come to <workdir>/soak.jsonl and the roles' logs to <workdir>/.../logs, so a run left
unattended keeps what it measured even if a role dies (the soak then stops, naming it).

    python bench/soak.py [--minutes 60] [--sample-s 60] [--warmup-minutes M] [--workdir DIR]
                         [--broker-max-mb MB] [--handover-at MIN,MIN]

A handover restarts every role, so with handovers every few minutes the longest stretch holds
few samples: each process's memory is also fitted within every lifetime (a slope with an
intercept per stretch, --restart-warmup-minutes left out after each handover), and that is the
RESULT's. `--from-samples soak.jsonl --handed-over-at 12,27` reports on a soak run before.

Last line: RESULT rss_growth_mb_per_h=<max over the roles, within lifetimes>
store_bytes_per_rollout=<slope of
store bytes over rollouts stored> lag_growth=<messages per hour, all groups>, then which role
that RSS slope is, the embedded broker's own RSS slope and its highest RSS, the handovers and
their longest pause, rollouts/s, and lost= (what the store lacks or holds twice once the soak
stopped: train steps missing or trained twice, rollouts never scored, eval tasks never rolled
out, ids stored with two contents). (Messages on the bus, and the tally by topic, count the
current broker's only.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rlbus.bus import Bus
from rlbus.bus.broker_handover import Handover
from rlbus.bus.connection import client_options
from rlbus.bus.lag import Lag
from rlbus.bus.store import open_store
from rlbus.config import Settings
from rlbus.config.runs import load_run_config
from rlbus.consumers.inference.model_init import init_model
from rlbus.discovery import local_broker, store_served_elsewhere
from rlbus.launch.processes import RoleProcess
from rlbus.launch.supervisor import LocalRun
from rlbus.schemas import TaskPublished

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support
from support import serve_in_child

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "reverse_text"
RUN = "soak-rl"
EVAL = "soak-eval"
SERVE = "import sys; from rlbus.launch.scripted_model import ScriptedModel, serve_scripted; "
SERVE += "serve_scripted(ScriptedModel(record=False), int(sys.argv[1]))"
console = Console(width=150)  # logs of unattended runs too


@dataclass
class Sample:
    minute: float
    rss_mb: dict[str, float] = field(default_factory=dict)
    """By process: the run's roles, the eval's ("eval env", "eval judge"), "tansu"."""
    anon_mb: dict[str, float] = field(default_factory=dict)
    """The anonymous part of each RSS (heaps), without the mapped files (libraries)."""
    engine_mb: dict[str, float] = field(default_factory=dict)
    """The sink's ClickHouse engine, as it counts itself: "tracked" (MemoryTracking),
    "jemalloc allocated" and "jemalloc resident" (its allocator serves only the engine); the
    sink's anonymous RSS less the resident part is Python's and Arrow's."""
    engine_counts: dict[str, int] = field(default_factory=dict)
    """The sink's engine, counted by itself: its global pool's threads ("GlobalThread", idle ones
    included) and its parts ("PartsActive", "PartsOutdated": merged away, kept a while)."""
    open_files: dict[str, int] = field(default_factory=dict)
    threads: dict[str, int] = field(default_factory=dict)
    """Each process's threads (an engine's idle pool threads included)."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds (user + system) each process has used so far."""
    fd_kinds: dict[str, dict[str, int]] = field(default_factory=dict)
    """Each process's open files by kind (socket, pipe, /proc, file, ...): what grows, if any."""
    store_bytes: dict[str, int] = field(default_factory=dict)
    """By table (database.table), active parts on disk."""
    claims_bytes: int = 0
    checkpoint_bytes: int = 0
    lag: dict[str, int] = field(default_factory=dict)
    """By consumer group: end offsets minus committed offsets, over its partitions."""
    rollouts: dict[str, int] = field(default_factory=dict)
    """Rollouts stored so far, by run."""
    events: int = 0
    """Messages on rlbus's topics so far (their end offsets)."""


TICKS = os.sysconf("SC_CLK_TCK")


def proc_stats(pid: int) -> tuple[float, float, int, int, float] | None:
    """(RSS and its anonymous part in MB, open file descriptors, threads, CPU seconds so far) of
    a live process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    figures = {
        line.split(":")[0]: int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("VmRSS:", "RssAnon:", "Threads:"))
    }
    # Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    utime, stime = stat.rpartition(")")[2].split()[11:13]
    cpu_s = (int(utime) + int(stime)) / TICKS
    rss_mb, anon_mb = figures["VmRSS"] / 1024, figures["RssAnon"] / 1024  # /proc gives kB
    return rss_mb, anon_mb, fds, figures["Threads"], cpu_s


def fd_kinds(pid: int) -> dict[str, int]:
    kinds: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(FileNotFoundError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                kind = target.split(":")[0] if ":" in target else target.split("/")[1] or "/"
                kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


ENGINE_COUNTS = ("GlobalThread", "PartsActive", "PartsOutdated")


def store_figures(
    settings: Settings,
) -> tuple[dict[str, int], dict[str, int], dict[str, float], dict[str, int]]:
    """(bytes by table, rollouts by run, the engine's own memory figures in MB, its threads and
    parts), through the sink's read-only endpoint (its queries run in the sink's engine)."""
    if not store_served_elsewhere(settings):
        return {}, {}, {}, {}
    with open_store(settings.store.url, read_only=True) as store:
        tables = store.query(
            "SELECT concat(database, '.', table), sum(bytes_on_disk) FROM system.parts "
            "WHERE active GROUP BY database, table"
        ).rows
        runs = store.query("SELECT run_id, count() FROM rollouts GROUP BY run_id").rows
        engine = store.engine_memory_mb()
        counts = store.query(
            "SELECT metric, value FROM system.metrics WHERE metric IN {names:Array(String)}",
            {"names": list(ENGINE_COUNTS)},
        ).rows
    return (
        {str(t): int(b) for t, b in tables},
        {str(r): int(n) for r, n in runs},
        engine,
        {str(m): int(n) for m, n in counts},
    )


class RunOf(msgspec.Struct):
    """The one field of any event that the tally below reads."""

    run_id: str = ""


Tally = dict[tuple[str, str], list[int]]
"""(run, topic) -> [messages, bytes: key + value + headers, as on the wire]."""


async def topic_tally(settings: Settings) -> Tally:
    """Every message on rlbus's topics, counted by run and topic."""
    prefix = settings.kafka.topic_prefix
    async with Lag(settings.kafka) as lag:
        partitions = await lag.partitions()
    reader = AIOKafkaConsumer(**client_options(settings.kafka), enable_auto_commit=False)
    await reader.start()
    tally: Tally = {}
    try:
        reader.assign(partitions)
        await reader.seek_to_beginning(*partitions)
        ends = await reader.end_offsets(partitions)
        left = {tp for tp in partitions if ends[tp] > 0}
        while left:
            for tp, records in (await reader.getmany(*left, timeout_ms=1000)).items():
                for r in records:
                    try:
                        run = msgspec.msgpack.decode(r.value or b"", type=RunOf).run_id
                    except msgspec.DecodeError:
                        run = "-"  # JSON from outside, or rlbus's own progress records
                    size = len(r.key or b"") + len(r.value or b"")
                    size += sum(len(k) + len(v) for k, v in r.headers or ())
                    counts = tally.setdefault((run, tp.topic.removeprefix(prefix)), [0, 0])
                    counts[0] += 1
                    counts[1] += size
                if records and records[-1].offset + 1 >= ends[tp]:
                    left.discard(tp)
    finally:
        await reader.stop()
    return tally


class EvalRun:
    """The eval run beside the RL run: its env producer and judge against a scripted model
    server, and its task stream; stopped before a broker handover (they are its clients too)
    and started again on the new broker."""

    def __init__(self, logs: Path, per_s: float):
        self.logs = logs
        self.per_s = per_s
        self.published = 0
        """Tasks published so far, over every broker: task ids go on from there."""
        self.server, self.url = serve_in_child(SERVE)
        self.roles: dict[str, RoleProcess] = {}
        self.stopping = asyncio.Event()
        self.stream: asyncio.Task[None] | None = None

    def start(self, settings: Settings) -> None:
        eval_settings = settings.model_copy(update={"run_id": EVAL})
        env_args = [str(EXAMPLE), "--model", "scripted", "--base-url", self.url]
        self.roles = {
            "eval env": RoleProcess("env", eval_settings, self.logs / "eval", env_args),
            "eval judge": RoleProcess("judge", eval_settings, self.logs / "eval", [str(EXAMPLE)]),
        }
        self.stopping = asyncio.Event()
        self.stream = asyncio.create_task(self._tasks(eval_settings, self.stopping))

    async def _tasks(self, settings: Settings, stop: asyncio.Event) -> None:
        """Tasks for the eval run, at a steady rate, until `stop`."""
        async with Bus.of(settings) as bus:
            while not stop.is_set():
                n = self.published
                task = TaskPublished(
                    task_id=f"e{n}", env="reverse_text", prompt=f"Reverse: soak{n:07d}", run_id=EVAL
                )
                await bus.publish(task)
                self.published += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1 / self.per_s)

    async def stop(self) -> None:
        self.stopping.set()
        if self.stream is not None:
            await self.stream
        for role in self.roles.values():
            await asyncio.to_thread(role.stop)

    def close(self) -> None:
        self.server.terminate()
        self.server.wait(10)


def sample(
    minute: float,
    processes: dict[str, int],
    settings: Settings,
    workdir: Path,
    lag: dict[str, int],
) -> Sample:
    s = Sample(minute, lag=lag)
    for name, pid in processes.items():
        stats = proc_stats(pid)
        if stats is not None:
            s.rss_mb[name], s.anon_mb[name], s.open_files[name], s.threads[name], s.cpu_s[name] = (
                stats
            )
            s.fd_kinds[name] = fd_kinds(pid)
    s.store_bytes, s.rollouts, s.engine_mb, s.engine_counts = store_figures(settings)
    s.claims_bytes = folder_bytes(workdir / "claims")
    s.checkpoint_bytes = folder_bytes(workdir / "checkpoints")
    return s


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0 with fewer than two points)."""
    if len(points) < 2:
        return 0.0
    xs, ys = zip(*points, strict=True)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def per_hour(samples: list[Sample], value: str, key: str | None = None) -> float:
    points = [
        (s.minute / 60, figure) for s in samples if (figure := value_of(s, value, key)) is not None
    ]
    return slope(points)


def value_of(s: Sample, value: str, key: str | None = None) -> float | None:
    """One series' figure in a sample: a field, one key of a dict field, or a dict's sum."""
    figure = getattr(s, value)
    if key is not None:
        return figure.get(key)
    return float(sum(figure.values())) if isinstance(figure, dict) else float(figure)


def report(
    samples: list[Sample],
    warmups: tuple[float, float],
    stopped_by: str,
    handed_over: list[float],
    handover_pause_max_s: float = 0.0,
    counted: dict[str, int] | None = None,
) -> None:
    """Each series over the longest stretch without a handover, after its warm-up: first,
    last, the slope over all those samples and over their second half (a step, such as a
    thread pool growing once, flattens there; growth without bound does not); each process's
    memory also within every lifetime (`within_lifetimes`: with handovers, the longest stretch
    may be a few samples). `warmups`: minutes skipped after the start and after a handover."""
    warmup_minutes = warmups[0]
    after = longest_stretch(samples, warmup_minutes, handed_over)
    if len(after) < 2:
        console.print(f"[red]only {len(after)} samples after the warm-up: no slopes[/red]")
        after = samples
    late = after[len(after) // 2 :]
    first, last = after[0], after[-1]
    title = f"minutes {first.minute:.0f}-{last.minute:.0f}: {len(after)} samples"
    table = Table(title=f"{title} (the longest stretch without a handover, after its warm-up)")
    for col in ("series", "first", "last", "per hour", "per hour, 2nd half"):
        table.add_column(col, justify="right" if col != "series" else "left")

    def row(label: str, value: str, key: str | None = None, scale: float = 1.0) -> float:
        start, end = value_of(first, value, key), value_of(last, value, key)
        whole, second = per_hour(after, value, key), per_hour(late, value, key)
        table.add_row(
            label,
            "-" if start is None else f"{start / scale:.6g}",
            "-" if end is None else f"{end / scale:.6g}",
            f"{whole / scale:+.4g}",
            f"{second / scale:+.4g}",
        )
        return whole

    for name in last.rss_mb:
        row(f"RSS MB {name}", "rss_mb", name)
    for name in last.anon_mb:
        row(f"  anonymous MB {name}", "anon_mb", name)
    for name in last.engine_mb:
        row(f"sink engine MB, {name}", "engine_mb", name)
    for name in last.engine_counts:
        row(f"sink engine, {name}", "engine_counts", name)
    for name in last.threads:
        row(f"threads {name}", "threads", name)
    for name in last.open_files:
        row(f"open files {name}", "open_files", name)
        before = first.fd_kinds.get(name, {})
        for kind, n in last.fd_kinds.get(name, {}).items():
            if n != before.get(kind, 0):
                table.add_row(f"  of which {kind}", str(before.get(kind, 0)), str(n), "", "")
    for name in sorted(last.store_bytes, key=lambda t: -last.store_bytes[t]):
        row(f"store MB {name}", "store_bytes", name, 1e6)
    row("claim store MB", "claims_bytes", scale=1e6)
    row("checkpoints MB", "checkpoint_bytes", scale=1e6)
    for name in sorted(last.lag):
        row(f"lag {name}", "lag", name)
    for run in sorted(last.rollouts):
        row(f"rollouts stored, {run}", "rollouts", run)
    console.print(table)
    rss = {
        name: within_lifetimes(samples, warmups, handed_over, "rss_mb", name)
        for name in last.rss_mb
    }
    lifetimes = Table(
        title=f"RSS growth within every lifetime ({len(handed_over) + 1} stretches, "
        f"{warmups[0]:g} min skipped after the start, {warmups[1]:g} after a handover)"
    )
    for col in ("process", "MB per hour", "standard error"):
        lifetimes.add_column(col, justify="right" if col != "process" else "left")
    for name, (mb, error) in rss.items():
        lifetimes.add_row(name, f"{mb:+.1f}", f"{error:.1f}")
    console.print(lifetimes)
    cpu_table(after)
    if counted is not None:
        kept = Table(title="lost or doubled, counted in the store after the soak")
        kept.add_column("what")
        kept.add_column("count", justify="right")
        for what, n in counted.items():
            kept.add_row(what, str(n))
        console.print(kept)
    load = os.getloadavg()
    console.print(f"load average (1, 5, 15 min) at the end: {load} on {os.cpu_count()} cores")
    console.print(f"stopped: {stopped_by}")
    rollouts_per_h = per_hour(after, "rollouts")
    store_per_h = per_hour(after, "store_bytes")
    per_rollout = store_per_h / rollouts_per_h if rollouts_per_h else float("nan")
    roles = {n: mb for n, (mb, _) in rss.items() if n != "tansu"}
    worst = max(roles, key=lambda n: roles[n]) if roles else "-"
    print(
        f"RESULT rss_growth_mb_per_h={roles.get(worst, 0.0):.1f} "
        f"rss_growth_error_mb_per_h={rss[worst][1] if worst in rss else 0.0:.1f} "
        f"store_bytes_per_rollout={per_rollout:.0f} "
        f"lag_growth={per_hour(after, 'lag'):.0f} worst_role={worst.replace(' ', '_')} "
        f"broker_rss_growth_mb_per_h={rss.get('tansu', (0.0, 0.0))[0]:.1f} "
        f"broker_rss_max_mb={max((s.rss_mb.get('tansu', 0.0) for s in samples), default=0):.0f} "
        f"handovers={len(handed_over)} "
        f"handover_pause_max_s={handover_pause_max_s:.1f} "
        f"rollouts_per_s={rollouts_per_h / 3600:.1f}"
        + ("" if counted is None else f" lost={sum(counted.values())}")
    )


def lifetimes(
    samples: list[Sample], warmups: tuple[float, float], handed_over: list[float]
) -> list[list[Sample]]:
    """The samples of each stretch between handovers (a handover restarts every role), each
    read `warmups[0]` minutes after the start or `warmups[1]` after the handover before it."""
    starts = [0.0, *handed_over]
    ends = [*handed_over, float("inf")]
    skips = [warmups[0], *(warmups[1] for _ in handed_over)]
    return [
        [s for s in samples if start + skip <= s.minute < end]
        for start, end, skip in zip(starts, ends, skips, strict=True)
    ]


def longest_stretch(
    samples: list[Sample], warmup_minutes: float, handed_over: list[float]
) -> list[Sample]:
    """The longest run of samples with no handover among them, each taken `warmup_minutes` or
    more after the start or the handover before it."""
    return max(lifetimes(samples, (warmup_minutes, warmup_minutes), handed_over), key=len)


SETTLED_S = 120
"""What had this long to be handled before the last one of its kind was stored counts as lost
when it was not (what came later may have been in flight when the soak stopped)."""
INTEGRITY = {
    "steps missing": f"""
        SELECT max(step) - count(DISTINCT step) FROM train_steps FINAL WHERE run_id = '{RUN}'""",
    "steps trained twice": f"""
        SELECT count() FROM (SELECT step FROM train_steps FINAL WHERE run_id = '{RUN}'
                             GROUP BY step HAVING count() > 1)""",
    "rollouts never scored": f"""
        SELECT count() FROM rollouts FINAL
        WHERE ts < (SELECT max(ts) FROM rollouts) - {SETTLED_S}
          AND rollout_id NOT IN (SELECT rollout_id FROM scored)""",
    "eval tasks never rolled out": f"""
        SELECT count() FROM tasks FINAL
        WHERE run_id = '{EVAL}' AND ts < (SELECT max(ts) FROM tasks) - {SETTLED_S}
          AND task_id NOT IN (SELECT task_id FROM rollouts WHERE run_id = '{EVAL}')""",
    "ids stored with two contents": "SELECT count() FROM conflicts",
}
"""Nothing lost or doubled across the handovers, counted in the store once the soak stopped."""


def integrity(store_url: str) -> dict[str, int]:
    with open_store(store_url, read_only=True) as store:
        return {what: int(store.query(sql).rows[0][0]) for what, sql in INTEGRITY.items()}


def within_lifetimes(
    samples: list[Sample],
    warmups: tuple[float, float],
    handed_over: list[float],
    value: str,
    key: str | None = None,
) -> tuple[float, float]:
    """The growth per hour of one series within its processes' lifetimes, and its standard
    error: a handover restarts every role, so each stretch between handovers is a lifetime of
    its own, read after its warm-up (`warmups`: after the start, after a handover); the slope
    is the least-squares one with an intercept per stretch (each stretch's points centred on
    their own means), so every stretch counts and the drop at a restart does not. The error
    takes the samples' scatter about that fit as independent noise (a sawtooth is not quite,
    so read it as a lower bound): a slope within two of it of a goal is not told apart."""
    centred: list[list[tuple[float, float]]] = []
    for stretch in lifetimes(samples, warmups, handed_over):
        points = [
            (s.minute / 60, figure)
            for s in stretch
            if (figure := value_of(s, value, key)) is not None
        ]
        if len(points) < 3:
            continue
        mean_t = statistics.fmean(t for t, _ in points)
        mean_y = statistics.fmean(y for _, y in points)
        centred.append([(t - mean_t, y - mean_y) for t, y in points])
    within = sum(t * t for points in centred for t, _ in points)
    if not within:
        return float("nan"), float("nan")
    growth = sum(t * y for points in centred for t, y in points) / within
    freedom = sum(len(points) for points in centred) - len(centred) - 1
    scatter = sum((y - growth * t) ** 2 for points in centred for t, y in points)
    error = math.sqrt(scatter / freedom / within) if freedom > 0 else float("nan")
    return growth, error


def cpu_table(after: list[Sample]) -> None:
    """CPU of each process after the warm-up: cores it kept busy, per rollout of its run, per
    message on the bus."""
    table = Table(title="CPU after the warm-up")
    for col in ("process", "cores", "ms per rollout of its run", "us per message on the bus"):
        table.add_column(col, justify="right" if col != "process" else "left")
    events_per_h = per_hour(after, "events")
    for name in after[-1].cpu_s:
        cpu_per_h = per_hour(after, "cpu_s", name)
        run = EVAL if name.startswith("eval ") else RUN
        rollouts_per_h = per_hour(after, "rollouts", run)
        table.add_row(
            name,
            f"{cpu_per_h / 3600:.2f}",
            f"{1000 * cpu_per_h / rollouts_per_h:.1f}" if rollouts_per_h else "-",
            f"{1e6 * cpu_per_h / events_per_h:.0f}" if events_per_h else "-",
        )
    console.print(table)
    console.print(f"messages on the bus: {events_per_h / 3600:.0f}/s")


def run_config(workdir: Path, model: Path) -> tuple[Path, list[str]]:
    overrides = [
        "--run-id", RUN,
        "--model", str(model),
        "--max-steps", "1000000",
        "--store.url", f"chdb://{workdir / 'store'}",
        "--claim-check.url", str(workdir / "claims"),
        "--orchestrator.tasks-per-step", "4",
        "--orchestrator.eval-every", "0",
        "--trainer.checkpoint-url", str(workdir / "checkpoints" / RUN),
    ]  # fmt: skip
    return EXAMPLE / "rl.toml", overrides


LAG_WAIT_S = 60.0
"""Longest wait for one look at the consumer groups' lag."""


async def lag_now(settings: Settings) -> tuple[dict[str, int], int]:
    """Every consumer group's lag and the messages on the bus so far, on a connection of their
    own."""
    async with Lag(settings.kafka) as lag:
        return await lag.groups(), await lag.events()


async def watch(
    args: argparse.Namespace, run: LocalRun, settings: Settings, workdir: Path
) -> tuple[list[Sample], str, Tally, list[tuple[float, Handover, float]]]:
    """Feed the eval stream and sample every --sample-s until --minutes pass or a process
    dies; every sample is appended to <workdir>/soak.jsonl as it is taken. When the embedded
    broker holds more than kafka.embedded_max_rss_mb, hand it over as `rlbus run` does (the
    eval run stopped around it). Then tally what the last broker's topics hold, by run."""
    evals = EvalRun(run.run_dir / "logs", args.eval_tasks_per_s)
    evals.start(settings)
    samples: list[Sample] = []
    handovers: list[tuple[float, Handover, float]] = []
    stopped_by = f"{args.minutes:g} minutes passed"
    due = sorted(float(m) for m in args.handover_at.split(",") if m)
    started = time.monotonic()
    try:
        with Progress(console=console) as progress, (workdir / "soak.jsonl").open("a") as out:
            bar = progress.add_task("soak", total=args.minutes * 60)
            while (elapsed := time.monotonic() - started) < args.minutes * 60:
                watched = {**numbered(run.processes), **evals.roles}
                dead = [name for name, p in watched.items() if not p.alive()]
                if dead or (evals.stream is not None and evals.stream.done()):
                    stopped_by = f"{', '.join(dead) or 'the eval stream'} stopped"
                    break
                forced = bool(due) and elapsed / 60 >= due[0]
                if forced:
                    due.pop(0)
                if forced or run.broker_full(settings):
                    await evals.stop()
                    settings, _ = await asyncio.to_thread(run.replace_broker, settings, 600)
                    evals.start(settings)
                    handovers.append((elapsed / 60, *run.handovers[-1]))
                    continue
                pids = {name: p.proc.pid for name, p in watched.items()}
                if run.broker is not None and run.broker.pid is not None:
                    pids["tansu"] = run.broker.pid
                try:
                    lags, events = await asyncio.wait_for(lag_now(settings), LAG_WAIT_S)
                except TimeoutError:
                    # In one soak (stop 44) the first look never returned and nothing was
                    # sampled; the next look opens connections of its own.
                    console.print(f"no lag from the broker within {LAG_WAIT_S:g} s: looking again")
                    await asyncio.sleep(1)
                    continue
                s = await asyncio.to_thread(sample, elapsed / 60, pids, settings, workdir, lags)
                s.events = events
                samples.append(s)
                out.write(json.dumps(asdict(s)) + "\n")
                out.flush()
                stored = sum(s.rollouts.values())
                progress.update(bar, completed=elapsed, description=f"{stored} rollouts")
                next_at = started + len(samples) * args.sample_s
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        await evals.stop()
        evals.close()
    return samples, stopped_by, await topic_tally(settings), handovers


def soak(args: argparse.Namespace, workdir: Path) -> None:
    model = workdir / "tiny"
    if not model.exists():
        init_model(model, seed=0)
    config, overrides = run_config(workdir, model)
    overrides += ["--kafka.embedded-max-rss-mb", str(args.broker_max_mb)]
    overrides += ["--kafka.embedded-handover-every-s", "60"]
    cfg = load_run_config(config, overrides)
    run = LocalRun(cfg, config, overrides, resume=False, console=console)
    logs = run.run_dir / "logs"
    with local_broker(cfg.base()) as (base, broker):
        run.broker = broker
        run.handed_over = time.monotonic()
        try:
            run.start_roles(base)
            samples, stopped_by, tally, handovers = asyncio.run(watch(args, run, base, workdir))
        finally:
            run.stop()
    console.print(f"role logs: {logs}; samples: {workdir / 'soak.jsonl'}")
    per_rollout(tally)
    handover_table(handovers)
    warmups = (args.warmup_minutes, args.restart_warmup_minutes)
    pause = max((p for _, _, p in handovers), default=0.0)
    counted = integrity(cfg.store.url)
    report(samples, warmups, stopped_by, [m for m, _, _ in handovers], pause, counted)


def handover_table(handovers: list[tuple[float, Handover, float]]) -> None:
    table = Table(title=f"broker handovers: {len(handovers)}")
    for col in ("minute", "carried", "carried MB", "left behind", "groups", "pause s"):
        table.add_column(col, justify="right")
    for minute, done, paused in handovers:
        table.add_row(
            f"{minute:.1f}",
            f"{done.carried:,}",
            f"{done.carried_bytes / 1e6:.2f}",
            f"{done.left:,}",
            str(done.groups),
            f"{paused:.1f}",
        )
    console.print(table)


def per_rollout(tally: Tally) -> None:
    """Messages and bytes on the bus per rollout, by topic, for each run that has rollouts."""
    for run in sorted({r for r, _ in tally}):
        rollouts = tally.get((run, "rollouts"), [0, 0])[0]
        if not rollouts:
            continue
        table = Table(title=f"on the bus per rollout of {run} ({rollouts} rollouts)")
        for col in ("topic", "messages", "bytes", "messages per rollout", "bytes per rollout"):
            table.add_column(col, justify="right" if col != "topic" else "left")
        rows = sorted(((t, c) for (r, t), c in tally.items() if r == run), key=lambda x: -x[1][1])
        for topic, (n, size) in rows:
            table.add_row(topic, str(n), str(size), f"{n / rollouts:.2f}", f"{size / rollouts:.0f}")
        total = [sum(c[0] for _, c in rows), sum(c[1] for _, c in rows)]
        table.add_row(
            "all",
            str(total[0]),
            str(total[1]),
            f"{total[0] / rollouts:.2f}",
            f"{total[1] / rollouts:.0f}",
        )
        console.print(table)


def numbered(processes: list[RoleProcess]) -> dict[str, RoleProcess]:
    """Processes by role, numbered where a role runs more than once (env, env 2)."""
    out: dict[str, RoleProcess] = {}
    for p in processes:
        name, n = p.role, 1
        while name in out:
            n += 1
            name = f"{p.role} {n}"
        out[name] = p
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--sample-s", type=float, default=60)
    parser.add_argument(
        "--warmup-minutes", type=float, default=None, help="default: a fifth of --minutes, >= 2"
    )
    parser.add_argument("--eval-tasks-per-s", type=float, default=1.0)
    parser.add_argument(
        "--broker-max-mb",
        type=int,
        default=0,
        help="kafka.embedded_max_rss_mb (0: an eighth of this machine's memory)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary one")
    parser.add_argument(
        "--restart-warmup-minutes",
        type=float,
        default=None,
        help="minutes of each lifetime after a handover left out of the slopes within "
        "lifetimes (default: --warmup-minutes; a reopened sink's engine takes as long to settle "
        "as a new one's)",
    )
    parser.add_argument(
        "--handover-at",
        default="",
        help="hand the broker over at these minutes too, whatever it holds (12,40): a long "
        "lifetime after a handover, to read the slopes of roles reopened on a grown store",
    )
    parser.add_argument(
        "--from-samples",
        type=Path,
        help="report on a soak.jsonl written before instead of soaking (with --handed-over-at)",
    )
    parser.add_argument(
        "--handed-over-at", default="", help="with --from-samples: the handovers' minutes, 12,27"
    )
    args = parser.parse_args()
    if args.warmup_minutes is None:
        args.warmup_minutes = max(2.0, args.minutes / 5)
    if args.restart_warmup_minutes is None:
        args.restart_warmup_minutes = args.warmup_minutes
    if args.from_samples:
        lines = args.from_samples.read_text().splitlines()
        samples = [Sample(**json.loads(line)) for line in lines]
        handed_over = [float(m) for m in args.handed_over_at.split(",") if m]
        warmups = (args.warmup_minutes, args.restart_warmup_minutes)
        store = args.from_samples.parent / "store"
        counted = integrity(f"chdb://{store}") if store.is_dir() else None
        report(samples, warmups, f"samples of {args.from_samples}", handed_over, 0.0, counted)
        return
    with tempfile.TemporaryDirectory() as tmp:
        workdir = (args.workdir or Path(tmp)).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        console.print(f"soak: {args.minutes:g} min in {workdir}")
        soak(args, workdir)


if __name__ == "__main__":
    main()
