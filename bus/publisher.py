"""Publishing events: encoded (bus.messages), sent, and awaited until the broker acknowledged
them (acks=all). Topics are created on first use with the configured partition count."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.structs import RecordMetadata
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from rlbus.bus import telemetry
from rlbus.bus.claim_check import ClaimStore
from rlbus.bus.connection import client_options
from rlbus.bus.partitioner import partition_of
from rlbus.bus.records import Headers, events_by_message, to_batch_message
from rlbus.config import KafkaConfig
from rlbus.schemas import Event, topic_of


@dataclass(slots=True)
class Sending:
    """Whether a handler's outputs began to go out. Once they have, a stop lets the handler
    finish (bus.subscribers): what it sent reaches the broker anyway, as the producer flushes
    when it closes, and its event, run again, would publish other content under the same ids."""

    begun: bool = False


SENDING: ContextVar[Sending | None] = ContextVar("rlbus_sending", default=None)
"""The running handler's Sending, in a subscriber's handler task; None elsewhere."""


def _begin_sending() -> None:
    if (sending := SENDING.get()) is not None:
        sending.begun = True


class Topics:
    """Topic names with the configured prefix, created on first use."""

    def __init__(self, kafka: KafkaConfig):
        self.kafka = kafka
        self._admin: AIOKafkaAdminClient | None = None
        self._ensured: set[str] = set()
        self._lock = asyncio.Lock()

    def name(self, topic: str) -> str:
        return self.kafka.topic_prefix + topic

    async def start(self) -> None:
        self._admin = AIOKafkaAdminClient(**client_options(self.kafka))
        await self._admin.start()

    async def stop(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None

    async def ensure(self, topics: Iterable[str]) -> None:
        """Create the named (unprefixed) topics that do not exist yet."""
        wanted = [t for t in topics if t not in self._ensured]
        if not wanted:
            return
        if self._admin is None:
            raise RuntimeError("Bus is not started: use `async with Bus(...) as bus`")
        async with self._lock:
            existing = set(await self._admin.list_topics())
            missing = [self.name(t) for t in wanted if self.name(t) not in existing]
            if missing:
                new = [
                    NewTopic(t, self.kafka.partitions, self.kafka.replication_factor)
                    for t in missing
                ]
                try:
                    await self._admin.create_topics(new)
                except TopicAlreadyExistsError:
                    pass  # another process won the race; the topic is there either way
            self._ensured.update(wanted)


class Publisher:
    def __init__(self, kafka: KafkaConfig, topics: Topics, claims: ClaimStore, run_id: str):
        self.kafka = kafka
        self.topics = topics
        self.claims = claims
        self.run_id = run_id
        self._producer: AIOKafkaProducer | None = None
        self.acked: dict[tuple[str, int], int] = {}
        """The highest offset the broker acknowledged, per (topic, partition): what it had
        taken from this process (counted against the store when an embedded broker dies)."""

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            **client_options(self.kafka),
            acks="all",
            enable_idempotence=False,  # unsupported by the embedded broker; consumers dedup instead
            linger_ms=self.kafka.linger_ms,
            request_timeout_ms=self.kafka.request_timeout_ms,
            max_batch_size=1024 * 1024,
            max_request_size=self.kafka.max_request_size,
            # aiokafka documents any callable here but annotates its own class
            partitioner=partition_of,  # pyright: ignore[reportArgumentType]
        )
        await self._producer.start()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    def _started(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("Bus is not started: use `async with Bus(...) as bus`")
        return self._producer

    async def publish_many(
        self, events: Sequence[Event], parents: Mapping[str, Context | None] | None = None
    ) -> None:
        """Publish events (any topics) and wait until the broker acknowledged all of them. On a
        batched topic, the events of one key travel as one message (records.events_by_message).
        `parents`: the trace context to publish an event in, by event id (default: the
        current one), so events published together still join their own rollouts' traces; a
        message is published in its first event's."""
        producer = self._started()
        _begin_sending()
        for event in events:
            if not event.run_id:
                event.run_id = self.run_id
        await self.topics.ensure({topic_of(e).name for e in events})
        futures = []
        traced = telemetry.enabled()
        for message in events_by_message(events):
            if not traced:  # the hot path: no span machinery per message when nobody collects
                futures.append(await self._send(producer, message))
                continue
            first = message[0]
            attributes = {
                "messaging.system": "kafka",
                "rlbus.events": len(message),
                "rlbus.event_id": first.event_id,
            }
            name = f"publish {topic_of(first).name}"
            parent = parents.get(first.event_id) if parents else None
            with telemetry.span(name, SpanKind.PRODUCER, parent, attributes):
                futures.append(await self._send(producer, message))
        if futures:
            for meta in await asyncio.gather(*futures):
                self._acked(meta)

    async def _send(self, producer: AIOKafkaProducer, events: list[Event]) -> asyncio.Future:
        m = to_batch_message(events, self.claims)
        return await producer.send(self.topics.name(m.topic), m.value, key=m.key, headers=m.headers)

    async def publish_raw(
        self, topic: str, value: bytes, key: bytes | None = None, headers: Headers | None = None
    ) -> None:
        """Publish bytes as they are (tests, bridges); `topic` is unprefixed."""
        producer = self._started()
        _begin_sending()
        await self.topics.ensure([topic])
        meta = await producer.send_and_wait(
            self.topics.name(topic), value, key=key, headers=headers or []
        )
        self._acked(meta)

    def _acked(self, meta: RecordMetadata) -> None:
        key = (meta.topic, meta.partition)
        self.acked[key] = max(self.acked.get(key, -1), meta.offset)
