"""Reading a topic back from its start: what a restarting role published before it stopped
(the orchestrator's own batches), outside any consumer group."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition

from rlbus.bus.bus import Bus
from rlbus.bus.messages import from_record
from rlbus.schemas import Event


async def read_back(bus: Bus, topic: str, run_id: str, idle_ms: int = 500) -> list[Event]:
    """Every event of `run_id` on `topic` (unprefixed), oldest first per partition, up to its
    end when called. Messages that do not decode are left to the consumers that dead-letter
    them. The end is where every partition's reported end offset has been passed and a poll of
    `idle_ms` brought nothing more (the embedded broker can under-report end offsets)."""
    name = bus.topics.name(topic)
    await bus.topics.ensure([topic])
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bus.kafka.bootstrap_servers, enable_auto_commit=False
    )
    await consumer.start()
    try:
        await consumer.topics()  # metadata, so the partitions are known
        tps = [TopicPartition(name, p) for p in sorted(consumer.partitions_for_topic(name) or ())]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        events: list[Event] = []
        while True:
            polled = await consumer.getmany(timeout_ms=idle_ms)
            for records in polled.values():
                for record in records:
                    try:
                        event = from_record(topic, record, bus.claims)
                    except Exception:
                        continue
                    if event.run_id == run_id:
                        events.append(event)
            if polled:
                continue
            positions = [await consumer.position(tp) for tp in tps]
            if all(position >= ends[tp] for position, tp in zip(positions, tps, strict=True)):
                return events
    finally:
        await consumer.stop()
