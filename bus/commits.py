"""What a consumer may commit: per partition, the offset after the messages it has taken,
held back to the oldest message still running or held. A crash then redelivers every message
whose handling was not finished, and nothing before it (at least once, never a gap)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError
from aiokafka.structs import OffsetAndMetadata

log = logging.getLogger(__name__)

Polled = dict[TopicPartition, list[ConsumerRecord]]

COMMIT_TIMEOUT_S = 5.0
"""Longest wait for a commit: past it the broker is gone or stuck, and the commit is given up
(what it would have passed is redelivered) rather than holding up a stopping role."""


class Holds:
    """Offsets taken but not finished: a judge's incomplete group, an env producer's rollout
    still running. Counted, so the consumer's own hold on a running event and a handler's
    `Delivery.hold()` are independent."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], Counter[int]] = defaultdict(Counter)

    def add(self, topic: str, partition: int, offset: int) -> None:
        self._held[(topic, partition)][offset] += 1

    def discard(self, topic: str, partition: int, offset: int) -> None:
        held = self._held[(topic, partition)]
        if held[offset] > 1:
            held[offset] -= 1
        else:
            held.pop(offset, None)

    def offsets(self, topic: str, partition: int) -> list[int]:
        """Every held offset of a partition, in order."""
        return sorted(self._held.get((topic, partition), ()))

    def oldest(self, topic: str, partition: int) -> int | None:
        """The oldest held offset of a partition, if any."""
        held = self._held.get((topic, partition))
        return min(held) if held else None


class Offsets:
    """One consumer's place in its partitions: the messages taken so far, the held ones, and
    committing what may be committed."""

    def __init__(self, consumer: AIOKafkaConsumer, prefix: str, group: str):
        self.consumer = consumer
        self.prefix = prefix
        self.group = group
        self.holds = Holds()
        self._next: dict[TopicPartition, int] = {}
        """Next offset to read, per partition, after the messages taken so far."""

    def unfinished(self) -> list[tuple[TopicPartition, int, list[int]]]:
        """(partition, next offset to take, offsets still held below it) for every partition
        whose commit stops short of what was taken."""
        out = []
        for tp, next_offset in self._next.items():
            held = self.holds.offsets(tp.topic[len(self.prefix) :], tp.partition)
            if held:
                out.append((tp, next_offset, held))
        return out

    def taken(self, polled: Polled) -> None:
        for tp, records in polled.items():
            self._next[tp] = records[-1].offset + 1

    async def commit(self) -> None:
        assigned = self.consumer.assignment()
        for tp in [tp for tp in self._next if tp not in assigned]:
            del self._next[tp]  # revoked: its new owner resumes from the last commit
        commit = {}
        for tp, next_offset in self._next.items():
            held = self.holds.oldest(tp.topic[len(self.prefix) :], tp.partition)
            commit[tp] = OffsetAndMetadata(
                next_offset if held is None else min(held, next_offset), ""
            )
        if not commit:
            return
        try:
            await asyncio.wait_for(self.consumer.commit(commit), COMMIT_TIMEOUT_S)
        except TimeoutError:
            # The broker is gone or stuck: the messages stay uncommitted and are redelivered.
            log.warning("commit of group %s timed out after %gs", self.group, COMMIT_TIMEOUT_S)
        except CommitFailedError:
            # A rebalance moved these partitions away meanwhile; their new owner redelivers
            # from the last commit, and handling is idempotent.
            log.warning(
                "commit failed after a rebalance in group %s; redelivered from the last commit",
                self.group,
            )
