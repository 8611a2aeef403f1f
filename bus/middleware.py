"""What wraps every handler, written once for both kinds of subscriber: dropping redelivered
event ids, dead-lettering what cannot be decoded or handled, and a trace span per event."""

from __future__ import annotations

import traceback
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
    `capacity // 2` at least. Two generations of plain sets, the older dropped whole when the
    newer fills, keep a full one at about a third of an ordered dict's memory."""

    def __init__(self, capacity: int = 200_000):
        self._generation = max(1, capacity // 2)
        self._new: set[str] = set()
        self._old: set[str] = set()

    def add(self, event_id: str) -> bool:
        """True when the id is new."""
        if event_id in self._new or event_id in self._old:
            return False
        self._new.add(event_id)
        if len(self._new) >= self._generation:
            self._old, self._new = self._new, set()
        return True


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
