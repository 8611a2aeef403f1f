"""Reading a topic back from its start: what a restarting role published before it stopped
(the orchestrator's own batches, an event subscriber's progress), outside any consumer group."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from rlbus.bus.connection import client_options
from rlbus.bus.records import from_record
from rlbus.schemas import Event

if TYPE_CHECKING:
    from rlbus.bus.bus import Bus


@contextlib.asynccontextmanager
async def from_start(
    bus: Bus, topic: str
) -> AsyncIterator[tuple[AIOKafkaConsumer, list[TopicPartition]]]:
    """A consumer of every partition of `topic` (unprefixed), outside any consumer group,
    positioned at each partition's start."""
    name = bus.topics.name(topic)
    await bus.topics.ensure([topic])
    consumer = AIOKafkaConsumer(
        **client_options(bus.kafka), enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        await consumer.topics()  # metadata, so the partitions are known
        tps = [TopicPartition(name, p) for p in sorted(consumer.partitions_for_topic(name) or ())]
        consumer.assign(tps)
        # An explicit seek to each start offset: seek_to_beginning only requests a reset, which
        # the reset that assign() started (to the latest offset, by default) could overtake.
        for tp, start in (await consumer.beginning_offsets(tps)).items():
            consumer.seek(tp, start)
        yield consumer, tps
    finally:
        await consumer.stop()


async def polled_records(
    bus: Bus, topic: str, poll_ms: int = 500
) -> AsyncIterator[list[ConsumerRecord]]:
    """Every record on `topic` (unprefixed), as polled, oldest first per partition, up to its end
    when called: every partition read past the end offset it reported then. What is appended
    meanwhile is not waited for (a busy topic would never end). The embedded broker may report
    a partition's end as its last batch's first offset + 1: a fetch brings that batch whole."""
    async with from_start(bus, topic) as (consumer, tps):
        ends = await consumer.end_offsets(tps)
        behind = {tp for tp in tps if ends[tp] > 0}
        while behind:
            polled = await consumer.getmany(*behind, timeout_ms=poll_ms)
            for batch in polled.values():
                yield batch  # past the reported end too: newer is never wrong here
            behind = {tp for tp in behind if await consumer.position(tp) < ends[tp]}


async def read_records(bus: Bus, topic: str, poll_ms: int = 500) -> list[ConsumerRecord]:
    """Every record on `topic` (unprefixed), as polled_records reads them."""
    return [record async for batch in polled_records(bus, topic, poll_ms) for record in batch]


def run_events(
    bus: Bus, topic: str, records: Iterable[ConsumerRecord], run_id: str
) -> Iterator[tuple[ConsumerRecord, Event]]:
    """The events of `run_id` in `records` of `topic`, each with its record. Messages that do
    not decode are left to the consumers that dead-letter them."""
    for record in records:
        try:
            decoded = from_record(topic, record, bus.claims)
        except Exception:  # not ours to judge here
            continue
        for event in decoded:
            if event.run_id == run_id:
                yield record, event


async def events_back(bus: Bus, topic: str, run_id: str) -> AsyncIterator[Event]:
    """Every event of `run_id` on `topic` (unprefixed), oldest first per partition, up to its
    end when called, each decoded as it is read (a long run's history is never held whole)."""
    async for batch in polled_records(bus, topic):
        for _, event in run_events(bus, topic, batch, run_id):
            yield event


async def read_back(bus: Bus, topic: str, run_id: str) -> list[Event]:
    """Every event of `run_id` on `topic` (unprefixed), as events_back reads them."""
    return [event async for event in events_back(bus, topic, run_id)]
