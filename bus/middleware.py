"""What wraps every handler, written once for both kinds of subscriber: dropping redelivered
event ids, dead-lettering what cannot be decoded or handled, and a trace span per event."""

from __future__ import annotations

import traceback
from array import array
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiokafka import ConsumerRecord
from opentelemetry.trace import SpanKind

from rlbus.bus import telemetry
from rlbus.schemas import DeadLetter
from rlbus.schemas.ids import record_id

if TYPE_CHECKING:
    from rlbus.bus.subscribers import Delivery


class SeenIds:
    """Event ids already handled by this consumer, bounded: the newest `capacity` at most and
    `capacity // 2` at least, in memory allocated once, when it is made.

    Two generations, the older dropped whole when the newer fills; each an open-addressing
    table of 64-bit fingerprints (the id's hash, 0 marking a free slot) at most half full. A
    role's memory then stays flat while its dedup fills, which a set of the ids (~110 bytes an
    id, allocated as they come) does not. Two distinct ids share a fingerprint with odds of
    about capacity / 2**64 an event (Python's string hash, salted per process), which would
    drop the later one as a repeat."""

    def __init__(self, capacity: int = 200_000):
        self._generation = max(1, capacity // 2)
        slots = 1 << (2 * self._generation - 1).bit_length()  # a power of two, >= 2x the ids
        self._mask = slots - 1
        self._new, self._old = _table(slots), _table(slots)
        self._count = 0
        """Ids in the newer generation."""

    def add(self, event_id: str) -> bool:
        """True when the id is new."""
        fingerprint = (hash(event_id) & 0xFFFF_FFFF_FFFF_FFFF) or 1
        if self._find(self._old, fingerprint) < 0:
            return False
        slot = self._find(self._new, fingerprint)
        if slot < 0:
            return False
        self._new[slot] = fingerprint
        self._count += 1
        if self._count >= self._generation:
            self._old, self._new = self._new, _table(self._mask + 1)  # the oldest freed
            self._count = 0
        return True

    def _find(self, table: array, fingerprint: int) -> int:
        """The free slot where `fingerprint` would go, or -1 when it is there already."""
        slot = fingerprint & self._mask
        while True:
            held = table[slot]
            if held == 0:
                return slot
            if held == fingerprint:
                return -1
            slot = (slot + 1) & self._mask


def _table(slots: int) -> array:
    return array("Q", bytes(8 * slots))


class DeadLetters:
    """Messages a consumer gave up on, with the reason, raw bytes and origin. They are published
    with the commit that passes them, so a crash in between redelivers rather than loses them."""

    def __init__(self, group: str, prefix: str):
        self.group = group
        self.prefix = prefix
        self.pending: list[DeadLetter] = []

    def add(self, topic: str, record: ConsumerRecord, error: str, index: int | None = None) -> None:
        """`index`: the event's place in a message of several (each gets a letter of its own
        id); None for the message as a whole."""
        raw = record.value or b""
        where: tuple[object, ...] = (
            "dlq",
            self.group,
            self.prefix + topic,
            record.partition,
            record.offset,
        )
        if index is not None:
            where += (index,)
            error = f"event {index} of the message: {error}"
        self.pending.append(
            DeadLetter(
                event_id=record_id(*where, timestamp=record.timestamp, raw=raw),
                origin_topic=topic,
                origin_partition=record.partition,
                origin_offset=record.offset,
                consumer_group=self.group,
                error=error,
                raw=raw,
                key=record.key or b"",
            )
        )

    def add_failure(
        self, topic: str, record: ConsumerRecord, exc: Exception, index: int | None = None
    ) -> None:
        """A handler raised on this message (or on its event at `index`) alone."""
        trace = traceback.format_exc(limit=5)
        self.add(topic, record, f"handler: {type(exc).__name__}: {exc}\n{trace}", index)

    def take(self) -> list[DeadLetter]:
        letters, self.pending = self.pending, []
        return letters


def traced(handler: Callable[[Delivery], Awaitable[None]]) -> Callable[[Delivery], Awaitable[None]]:
    """Run a per-event handler in a consumer span, child of the publisher's trace context."""

    async def run(delivery: Delivery) -> None:
        if not telemetry.enabled():
            await handler(delivery)
            return
        attributes = {"messaging.system": "kafka", "rlbus.event_id": delivery.event.event_id}
        parent = telemetry.extract_context(delivery.headers)
        with telemetry.span(f"process {delivery.topic}", SpanKind.CONSUMER, parent, attributes):
            await handler(delivery)

    return run
