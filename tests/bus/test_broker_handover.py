"""A broker handover (bus.broker_handover) between two real embedded brokers: every consumer
group reads on the new broker exactly the messages it had not committed on the old one, with
their keys, headers and timestamps; a subscriber's progress record names the same messages;
what every group had committed stays behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from rlbus.bus.broker import EmbeddedBroker
from rlbus.bus.broker_handover import commit_offsets, hand_over
from rlbus.bus.connection import client_options
from rlbus.bus.progress import PartitionProgress, encode_progress
from rlbus.config import KafkaConfig

PREFIX = "handover."
HOUR_MS = 3_600_000


@pytest.fixture
def brokers() -> Iterator[tuple[KafkaConfig, KafkaConfig]]:
    with EmbeddedBroker() as old, EmbeddedBroker() as new:
        yield (
            KafkaConfig(bootstrap_servers=old.bootstrap_servers, topic_prefix=PREFIX),
            KafkaConfig(bootstrap_servers=new.bootstrap_servers, topic_prefix=PREFIX),
        )


def tp(topic: str, partition: int = 0) -> TopicPartition:
    return TopicPartition(PREFIX + topic, partition)


async def publish(kafka: KafkaConfig, messages: list[tuple[TopicPartition, bytes, int]]) -> None:
    producer = AIOKafkaProducer(**client_options(kafka), acks="all")
    await producer.start()
    try:
        for where, value, timestamp_ms in messages:
            await producer.send_and_wait(
                where.topic,
                value,
                key=value[:3],
                partition=where.partition,
                timestamp_ms=timestamp_ms,
                headers=[("origin", value)],
            )
    finally:
        await producer.stop()


async def commit(kafka: KafkaConfig, group: str, offsets: dict[TopicPartition, int]) -> None:
    await commit_offsets(kafka, PREFIX + group, offsets)


async def read_as(
    kafka: KafkaConfig, group: str, where: list[TopicPartition]
) -> dict[TopicPartition, list[tuple[bytes, bytes, int, list]]]:
    """What `group` reads next on each partition: from its commit, else from the start."""
    consumer = AIOKafkaConsumer(
        **client_options(kafka),
        group_id=PREFIX + group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.assign(where)
        ends = await consumer.end_offsets(where)
        read: dict[TopicPartition, list] = {p: [] for p in where}
        deadline = time.monotonic() + 20
        while [p for p in where if await consumer.position(p) < ends[p]]:
            assert time.monotonic() < deadline, f"{group} never reached the ends {ends}"
            for p, records in (await consumer.getmany(timeout_ms=500)).items():
                read[p] += [(r.key, r.value, r.timestamp, list(r.headers)) for r in records]
        return read
    finally:
        await consumer.stop()


async def everything(kafka: KafkaConfig, where: TopicPartition) -> list[bytes]:
    consumer = AIOKafkaConsumer(**client_options(kafka), enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([where])
        consumer.seek(where, 0)
        end = (await consumer.end_offsets([where]))[where]
        values: list[bytes] = []
        while await consumer.position(where) < end:
            for records in (await consumer.getmany(where, timeout_ms=500)).values():
                values += [r.value for r in records]
        return values
    finally:
        await consumer.stop()


def test_each_group_reads_on_the_new_broker_what_it_had_not_committed(
    brokers: tuple[KafkaConfig, KafkaConfig],
) -> None:
    old, new = brokers
    now = int(time.time() * 1000)
    tasks = [(tp("tasks"), f"task-{i}".encode(), now + i) for i in range(10)]
    tasks_p1 = [(tp("tasks", 1), f"late-{i}".encode(), now + i) for i in range(3)]
    nodes = [(tp("trace-nodes"), f"node-{i}".encode(), now + i) for i in range(5)]
    scored = [(tp("scored"), f"score-{i}".encode(), now + i) for i in range(4)]
    # Batches an hour old, which nothing carried can be about; the newest is always kept.
    batches = [(tp("batches"), f"batch-{i}".encode(), now - HOUR_MS + i) for i in range(3)]
    progress = PartitionProgress(PREFIX + "env.r.e", PREFIX + "tasks", 0, 9, [7])
    before = PartitionProgress(PREFIX + "env.r.e", PREFIX + "tasks", 0, 5, [3])

    async def scene() -> None:
        await publish(old, tasks + tasks_p1 + nodes + scored + batches)
        producer = AIOKafkaProducer(**client_options(old), acks="all")
        await producer.start()
        for record in (before, progress):  # the newest record of a key is the one read
            await producer.send_and_wait(
                PREFIX + "progress", encode_progress(record), key=b"env.r.e/tasks/0", partition=0
            )
        await producer.stop()
        # The env producer took tasks 0-5 of partition 0 and none of partition 1; the sink every
        # one. The orchestrator committed scores only: trace nodes are its to read too.
        await commit(old, "env.r.e", {tp("tasks"): 6})
        everything_taken = {
            tp("tasks", 1): 3,
            tp("trace-nodes"): 5,
            tp("scored"): 4,
            tp("batches"): 3,
        }
        await commit(old, "sink", {tp("tasks"): 10, **everything_taken})
        await commit(old, "orchestrator.r", {tp("scored"): 2})
        await commit(old, "trainer.r", {tp("batches"): 3})

    asyncio.run(scene())
    done = asyncio.run(hand_over(old, new))

    env = asyncio.run(read_as(new, "env.r.e", [tp("tasks"), tp("tasks", 1)]))
    assert [m[1] for m in env[tp("tasks")]] == [b"task-6", b"task-7", b"task-8", b"task-9"]
    assert [m[1] for m in env[tp("tasks", 1)]] == [b"late-0", b"late-1", b"late-2"]
    first = env[tp("tasks")][0]
    assert first == (b"tas", b"task-6", now + 6, [("origin", b"task-6")])  # as published
    sink = asyncio.run(read_as(new, "sink", [tp("tasks"), tp("tasks", 1), tp("trace-nodes")]))
    assert all(not read for read in sink.values()), sink  # the sink had taken everything
    orchestrator = asyncio.run(read_as(new, "orchestrator.r", [tp("scored"), tp("trace-nodes")]))
    assert [m[1] for m in orchestrator[tp("scored")]] == [b"score-2", b"score-3"]
    assert [m[1] for m in orchestrator[tp("trace-nodes")]] == [
        f"node-{i}".encode() for i in range(5)
    ]

    assert asyncio.run(everything(new, tp("batches"))) == [b"batch-2"]
    moved = [
        msgspec.msgpack.decode(v, type=PartitionProgress)
        for v in asyncio.run(everything(new, tp("progress")))
    ]
    # upto 9 with 7 unfinished, counted from task-6 (offset 0 on the new broker)
    assert moved == [PartitionProgress(PREFIX + "env.r.e", PREFIX + "tasks", 0, 3, [1])]
    assert (done.carried, done.left) == (4 + 3 + 5 + 2 + 1 + 1, 6 + 2 + 2 + 1)
