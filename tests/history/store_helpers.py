"""What the history tests share: settings for a broker of their own, the sink run in-process
until the store holds what a test waits for, and publishing as an outside client would."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiokafka import AIOKafkaProducer

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.store import Store
from rlbus.bus.waiting import wait_until
from rlbus.config import Settings, load_settings
from rlbus.consumers.sink.sink import run_sink


def broker_settings(broker: EmbeddedBroker, store: Path, prefix: str = "id.") -> Settings:
    return load_settings(
        overrides={
            "kafka": {"bootstrap_servers": broker.bootstrap_servers, "topic_prefix": prefix},
            "store": {"url": f"chdb://{store}", "flush_interval_s": 0.2, "conflict_check_s": 0.5},
            "claim_check": {"url": str(store.parent / "claims")},
        }
    )


async def sink_until(settings: Settings, store: Store, sql: str, expected: int) -> int:
    """Run the sink into `store` until `sql` counts `expected`; returns the count."""
    stop = asyncio.Event()
    sink = asyncio.create_task(run_sink(settings, store, stop))
    count = lambda: int(store.query(sql).rows[0][0])  # noqa: E731
    try:
        await wait_until(lambda: count() >= expected, 60, f"{expected} rows: {sql}")
        await asyncio.sleep(1.0)  # anything more would land now
    finally:
        stop.set()
        await sink
    return count()


async def publish_json(
    settings: Settings, lines: list[bytes], compression: str | None = None
) -> None:
    """As an outside client would: plain JSON, no headers, no rlbus code."""
    async with Bus.of(settings) as bus:
        await bus.ensure_topics(["tasks"])
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers, compression_type=compression
    )
    await producer.start()
    try:
        for line in lines:
            await producer.send_and_wait(settings.kafka.topic_prefix + "tasks", line)
    finally:
        await producer.stop()
