"""How late an idle rlbus subscriber sees a new event on the embedded broker, and what its
fetches cost the broker, at Kafka's default fetch wait (500 ms: what rlbus used before
`kafka.fetch_max_wait_ms`) and at rlbus's default.

    python bench/bus_latency.py [--wait-ms MS] [--trials 40] [--idle-consumers 12] [--idle-s 20]

Per wait, on one embedded broker:

1. latency: a subscriber of `weights` (as the inference role's) and a publisher; one
   `WeightVersion` at a time, after a random pause (50-600 ms: the subscriber idle, its fetch
   waiting at the broker): the time from the publish call to the handler's.
   Then the broker alone: a bare aiokafka consumer at a 2,000 ms wait, the same way (12 records):
   a broker that answers a waiting fetch only when its wait is over shows a median near half
   the wait (Kafka answers as soon as records arrive).
2. idle cost: `--idle-consumers` subscribers, each a group of its own, of every rlbus topic
   but `weights` (as the sink is), none published to, for `--idle-s` seconds: the broker's CPU
   share over that time.

`--wait-ms` compares another wait than rlbus's default with 500 ms.

Last line: RESULT latency_p50_ms=<at rlbus's default> latency_p50_vs_500=<that / at 500 ms>
                  latency_max_ms=<at rlbus's default> broker_idle_cpu_pct=<at rlbus's default>
                  broker_idle_cpu_pct_500=<at 500 ms>
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tests/support
from soak import proc_stats
from support.isolated import isolated_settings

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.config import KafkaConfig, Settings
from rlbus.schemas import TOPICS, WeightVersion

KAFKA_DEFAULT_WAIT_MS = 500
BARE_WAIT_MS = 2000


def with_wait(settings: Settings, wait_ms: int) -> Settings:
    return settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"fetch_max_wait_ms": wait_ms})}
    )


async def latencies(settings: Settings, trials: int) -> list[float]:
    """Seconds from each publish call to the handler's call, the subscriber idle before each."""
    arrived: dict[int, float] = {}
    got = asyncio.Event()
    stop = asyncio.Event()
    async with Bus.of(settings) as bus:

        @bus.subscriber("weights", group="latency", batch=True)
        async def handle(batch) -> None:
            for delivery in batch:
                arrived[delivery.event.version] = time.perf_counter()
            got.set()

        consuming = asyncio.create_task(handle.run(stop))
        await bus.publish(WeightVersion(version=0, step=0, uri="warm-up"))
        await asyncio.wait_for(got.wait(), 60)  # joined, and past its first fetch
        took = []
        for version in range(1, trials + 1):
            await asyncio.sleep(random.uniform(0.05, 0.6))
            got.clear()
            sent = time.perf_counter()
            await bus.publish(WeightVersion(version=version, step=version, uri="x"))
            await asyncio.wait_for(got.wait(), 30)
            took.append(arrived[version] - sent)
        stop.set()
        await consuming
    return took


async def bare_latencies(bootstrap: str, wait_ms: int, trials: int) -> list[float]:
    """Seconds from a bare produce to a bare consumer's getone, the consumer idle before each."""
    topic = f"bare-{random.getrandbits(32):x}"
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=wait_ms
    )
    await producer.start()
    await producer.send_and_wait(topic, b"warm-up")
    await consumer.start()
    try:
        await consumer.getone()
        took = []
        for _ in range(trials):
            await asyncio.sleep(random.uniform(0.05, 0.6))
            sent = time.perf_counter()
            await producer.send_and_wait(topic, b"x")
            await consumer.getone()
            took.append(time.perf_counter() - sent)
        return took
    finally:
        await consumer.stop()
        await producer.stop()


async def idle_cpu(settings: Settings, broker_pid: int, consumers: int, idle_s: float) -> float:
    """The broker's CPU share (% of one core) while `consumers` subscribers wait for nothing."""
    stop = asyncio.Event()
    async with Bus.of(settings) as bus:

        async def nothing(batch) -> None:
            raise AssertionError("nothing is published to these topics")

        topics = [topic.name for topic in TOPICS if topic.name != "weights"]
        subscribers = [
            bus.subscriber(*topics, group=f"idle-{i}", batch=True)(nothing)
            for i in range(consumers)
        ]
        running = [asyncio.create_task(s.run(stop)) for s in subscribers]
        await asyncio.sleep(5)  # joined and fetching
        before, started = cpu_s(broker_pid), time.perf_counter()
        await asyncio.sleep(idle_s)
        after, ended = cpu_s(broker_pid), time.perf_counter()
        stop.set()
        await asyncio.gather(*running)
    return 100 * (after - before) / (ended - started)


def cpu_s(pid: int) -> float:
    stats = proc_stats(pid)
    if stats is None:
        raise RuntimeError(f"the broker (pid {pid}) exited")
    return stats[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--idle-consumers", type=int, default=12)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument(
        "--wait-ms", type=int, default=KafkaConfig().fetch_max_wait_ms, help="default: rlbus's"
    )
    args = parser.parse_args()
    figures: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="rlbus-latency-") as work, EmbeddedBroker() as broker:
        assert broker.pid is not None
        for wait_ms in (KAFKA_DEFAULT_WAIT_MS, args.wait_ms):
            settings = with_wait(isolated_settings(broker, Path(work) / str(wait_ms)), wait_ms)
            print(f"fetch_max_wait_ms={wait_ms} ...", file=sys.stderr, flush=True)
            took = sorted(asyncio.run(latencies(settings, args.trials)))
            idle = idle_cpu(settings, broker.pid, args.idle_consumers, args.idle_s)
            figures[wait_ms] = {
                "p50": 1000 * statistics.median(took),
                "p90": 1000 * took[int(0.9 * (len(took) - 1))],
                "max": 1000 * took[-1],
                "cpu": asyncio.run(idle),
            }
        bare = asyncio.run(bare_latencies(broker.bootstrap_servers, BARE_WAIT_MS, 12))
    table = Table("kafka.fetch_max_wait_ms", "p50 ms", "p90 ms", "max ms", "broker CPU, idle")
    for wait_ms, f in figures.items():
        ms = [f"{f[key]:.1f}" for key in ("p50", "p90", "max")]
        table.add_row(str(wait_ms), *ms, f"{f['cpu']:.1f} %")
    Console().print(table)
    print(
        f"bare aiokafka consumer at a {BARE_WAIT_MS} ms wait: p50 "
        f"{1000 * statistics.median(bare):.0f} ms, max {1000 * max(bare):.0f} ms"
    )
    now, before = figures[args.wait_ms], figures[KAFKA_DEFAULT_WAIT_MS]
    print(
        f"RESULT latency_p50_ms={now['p50']:.1f} "
        f"latency_p50_vs_500={now['p50'] / before['p50']:.3f} "
        f"latency_max_ms={now['max']:.1f} broker_idle_cpu_pct={now['cpu']:.1f} "
        f"broker_idle_cpu_pct_500={before['cpu']:.1f}"
    )


if __name__ == "__main__":
    main()
