"""What an event subscriber finished past its committed offsets, kept on the `progress` topic.

A partition is committed only up to its oldest message still running, so when an env producer
restarts, the quick rollouts it had finished after a slow one would run again, under the same
ids and with other content. Kafka can keep such a set in a commit's metadata; the embedded
broker drops commit metadata, so each commit that leaves messages running also writes, per
partition, which offsets below what it has taken are still unfinished (a short list: at most the
subscriber's concurrency). A subscriber that starts, or is handed a partition, reads the latest
record of each of its partitions and skips what was finished.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from aiokafka import TopicPartition

from rlbus.bus.topic_reader import read_records

if TYPE_CHECKING:
    from rlbus.bus.bus import Bus

TOPIC = "progress"
"""Not an event topic: the sink does not store it; it is bookkeeping of consumer groups."""


class PartitionProgress(msgspec.Struct, frozen=True):
    group: str
    topic: str
    """The topic's name on the broker (prefixed)."""
    partition: int
    upto: int
    """The next offset the subscriber had not taken yet."""
    unfinished: list[int]
    """Offsets below `upto` still running (or held) then; every other one below it is done."""

    def finished(self, offset: int) -> bool:
        return offset < self.upto and offset not in self.unfinished


_decoder = msgspec.msgpack.Decoder(PartitionProgress)
_encoder = msgspec.msgpack.Encoder()


def key(group: str, tp: TopicPartition) -> bytes:
    return f"{group}/{tp.topic}/{tp.partition}".encode()


def encode_progress(progress: PartitionProgress) -> bytes:
    return _encoder.encode(progress)


async def latest(bus: Bus, group: str) -> dict[TopicPartition, PartitionProgress]:
    """The newest progress record of each partition of `group`."""
    found: dict[TopicPartition, PartitionProgress] = {}
    for record in await read_records(bus, TOPIC):
        try:
            progress = _decoder.decode(record.value or b"")
        except msgspec.DecodeError:
            continue
        if progress.group == group:
            found[TopicPartition(progress.topic, progress.partition)] = progress
    return found
