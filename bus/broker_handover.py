"""Handing an embedded broker's unfinished business to a fresh one, so that the memory of the
old one (Tansu's `memory://` storage keeps every message and has no retention) is given back
without a message lost or repeated.

What is carried, per partition, is a contiguous tail: from the oldest message some consumer
group has not committed (a group that reads the topic, by its commits elsewhere on it or by
schemas.Topic.groups, and has no commit on this partition has committed nothing here) to the
end. A topic that a restarting role reads back from its start (schemas.Topic.read_back) also
keeps every message published since the oldest message carried elsewhere (what a read-back may
be asked about) and its last one. Every group's committed offsets move to where its next message
landed, and the newest `progress` record of each partition (bus.progress) is rewritten in the new
offsets. What every group had committed is left behind: stored, or someone's to drop.

Only with every client of the old broker stopped: what is published or committed while this
runs would be missed. (Kafka and Redpanda keep their own retention; this is for the embedded
broker.)"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import OffsetAndMetadata

from rlbus.bus.connection import client_options
from rlbus.bus.lag import Lag
from rlbus.bus.progress import TOPIC as PROGRESS
from rlbus.bus.progress import PartitionProgress, encode_progress
from rlbus.config import KafkaConfig
from rlbus.schemas.topics import BY_NAME

READ_BACK_MARGIN_MS = 60_000
"""How much older than the oldest message carried elsewhere a read-back message may be and still
be carried: each producer stamps its own clock, and a batch is published after its events."""

SEND_AHEAD = 512
"""Messages sent before waiting for their acknowledgements (one producer keeps a partition's
order)."""

Offsets = dict[TopicPartition, int]
Send = Callable[[TopicPartition, ConsumerRecord, bytes | None], Awaitable[None]]
"""Publish a record again on the same partition (with another value, when given)."""

_progress = msgspec.msgpack.Decoder(PartitionProgress)


@dataclass
class Handover:
    """What a handover carried and what it left behind."""

    carried: int = 0
    carried_bytes: int = 0
    """Keys and values of the carried messages."""
    left: int = 0
    """Messages no group was still to read: not carried."""
    groups: int = 0
    """Consumer groups whose committed offsets were moved."""
    seconds: float = 0.0


async def hand_over(old: KafkaConfig, new: KafkaConfig) -> Handover:
    """Carry what is unfinished on the broker `old` names to the empty one `new` names."""
    started = time.monotonic()
    async with Lag(old) as lag:
        reader = lag.reader
        every = await lag.partitions(every_topic=True)
        partitions: dict[str, list[TopicPartition]] = {}
        for tp in every:
            partitions.setdefault(tp.topic, []).append(tp)
        committed = await lag.committed(every)
        starts = await lag.starts(every) if every else {}
        # One request for every end: asked per partition, an empty one takes Tansu 0.5 s.
        ends = await lag.reported_ends(every) if every else {}
        spans = {tp: (starts[tp], ends[tp]) for tp in every}
        lows = _lows(old.topic_prefix, partitions, committed, starts)
        done = Handover(groups=len(committed))
        await _create(new, {topic: len(tps) for topic, tps in partitions.items()})
        progress_topic = old.topic_prefix + PROGRESS

        def read_back(topic: str) -> bool:
            known = BY_NAME.get(topic.removeprefix(old.topic_prefix))
            return known is not None and known.read_back

        oldest_ms = None
        async with _sink(new) as send:
            for topic in sorted(partitions, key=read_back):  # read-back topics last
                if topic == progress_topic:
                    continue
                for tp in partitions[topic]:
                    if read_back(topic):
                        lows[tp] = await _read_back_low(reader, tp, spans[tp], lows[tp], oldest_ms)
                    async for record in _records(reader, tp, spans[tp]):
                        if record.offset < lows[tp]:
                            done.left += 1
                            continue
                        if not read_back(topic):
                            oldest_ms = min(oldest_ms or record.timestamp, record.timestamp)
                        await send(tp, record, None)
                        done.carried += 1
                        done.carried_bytes += len(record.value or b"") + len(record.key or b"")
            for tp in partitions.get(progress_topic, []):
                newest: dict[bytes | None, ConsumerRecord] = {}
                async for record in _records(reader, tp, spans[tp]):
                    newest[record.key] = record
                    done.left += 1
                for record in newest.values():
                    moved = _moved_progress(record, lows)
                    if moved is not None:
                        await send(tp, record, moved)
                        done.left -= 1
                        done.carried += 1
    await _commit(new, committed, lows)
    done.seconds = time.monotonic() - started
    return done


def _lows(
    prefix: str,
    partitions: dict[str, list[TopicPartition]],
    committed: dict[str, Offsets],
    starts: Offsets,
) -> Offsets:
    """Per partition, the oldest offset a group reading its topic has not committed."""
    readers: dict[str, list[str]] = {}
    for group, offsets in committed.items():
        role = group.removeprefix(prefix).split(".", 1)[0]
        for topic in partitions:
            known = BY_NAME.get(topic.removeprefix(prefix))
            if any(tp.topic == topic for tp in offsets) or (known and role in known.groups):
                readers.setdefault(topic, []).append(group)
    # A topic no group reads yet (a user's, or one whose readers have not joined) is carried
    # whole: who will read it, and from where, is not known here.
    return {
        tp: min(
            (committed[g].get(tp, starts[tp]) for g in readers.get(topic, ())), default=starts[tp]
        )
        for topic, tps in partitions.items()
        for tp in tps
    }


async def _read_back_low(
    reader: AIOKafkaConsumer,
    tp: TopicPartition,
    span: tuple[int, int],
    low: int,
    oldest_ms: int | None,
) -> int:
    """`low`, or earlier: the first message published since READ_BACK_MARGIN_MS before
    `oldest_ms`, and at least the partition's last one."""
    since = None if oldest_ms is None else oldest_ms - READ_BACK_MARGIN_MS
    first = last = None
    async for record in _records(reader, tp, span):
        last = record.offset
        if first is None and since is not None and record.timestamp >= since:
            first = record.offset
    return min(o for o in (first, last, low) if o is not None)


async def _records(
    reader: AIOKafkaConsumer, tp: TopicPartition, span: tuple[int, int]
) -> AsyncIterator[ConsumerRecord]:
    """Every message of `tp` from the span's start to its end, in order. Tansu 0.6 may report a
    partition's end as its last batch's first offset + 1: a fetch brings that batch whole."""
    start, end = span
    if end <= start:
        return
    reader.assign([tp])
    reader.seek(tp, start)
    while await reader.position(tp) < end:
        for records in (await reader.getmany(tp, timeout_ms=1000)).values():
            for record in records:
                yield record


def _moved_progress(record: ConsumerRecord, lows: Offsets) -> bytes | None:
    """The progress record's value in the offsets of the new broker (None: not one, or about a
    partition not on the broker)."""
    try:
        progress = _progress.decode(record.value or b"")
    except msgspec.DecodeError:
        return None
    low = lows.get(TopicPartition(progress.topic, progress.partition))
    if low is None:
        return None
    moved = PartitionProgress(
        progress.group,
        progress.topic,
        progress.partition,
        max(0, progress.upto - low),
        [o - low for o in progress.unfinished if o >= low],
    )
    return encode_progress(moved)


async def _create(kafka: KafkaConfig, topics: dict[str, int]) -> None:
    if not topics:
        return
    admin = AIOKafkaAdminClient(**client_options(kafka))
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(t, n, kafka.replication_factor) for t, n in topics.items()]
        )
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def _sink(kafka: KafkaConfig) -> AsyncIterator[Send]:
    """`send(tp, record, value)`: the record on the same partition of the new broker, its key,
    headers and timestamp kept; every one acknowledged when the block ends."""
    producer = AIOKafkaProducer(
        **client_options(kafka), acks="all", max_request_size=kafka.max_request_size
    )
    await producer.start()
    pending: list[asyncio.Future[object]] = []

    async def send(tp: TopicPartition, record: ConsumerRecord, value: bytes | None) -> None:
        pending.append(
            await producer.send(
                tp.topic,
                record.value if value is None else value,
                key=record.key,
                partition=tp.partition,
                timestamp_ms=record.timestamp,
                headers=list(record.headers),
            )
        )
        if len(pending) >= SEND_AHEAD:
            await asyncio.gather(*pending)
            pending.clear()

    try:
        yield send
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def commit_offsets(
    kafka: KafkaConfig, group: str, offsets: dict[TopicPartition, int]
) -> None:
    """Commit `offsets` for `group` (its name on the broker) without joining it."""
    consumer = AIOKafkaConsumer(**client_options(kafka), group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()})
    finally:
        await consumer.stop()


async def _commit(kafka: KafkaConfig, committed: dict[str, Offsets], lows: Offsets) -> None:
    """Each group's commits, in the new offsets: what it had taken of the carried tail."""
    for group, offsets in committed.items():
        moved = {tp: max(0, offset - lows[tp]) for tp, offset in offsets.items() if tp in lows}
        if moved:
            await commit_offsets(kafka, group, moved)
