"""The bus of one process: a publisher, topic administration, and the subscribers started from
it (bus.subscribers). It takes only its own settings: Kafka, the claim check and the run id
stamped on what it publishes.

    async with Bus.of(settings) as bus:
        await bus.publish(TaskPublished(...))

        @bus.subscriber("rollouts", group="judge", batch=True)
        async def handle(batch: list[Delivery]) -> None: ...

        await handle.run(stop)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, overload

from opentelemetry.context import Context

from rlbus.bus.claim_check import ClaimStore
from rlbus.bus.health import quiet_kafka_client, watch_broker
from rlbus.bus.ledger import write_ledger
from rlbus.bus.publisher import Publisher, Topics
from rlbus.bus.records import Headers
from rlbus.bus.subscribers import BatchHandler, BatchSubscriber, EventHandler, EventSubscriber
from rlbus.config import ClaimCheckConfig, KafkaConfig, Settings
from rlbus.schemas import Event

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5.0
"""Longest wait for the producer, consumers and admin client to close."""


class Bus:
    def __init__(self, kafka: KafkaConfig, claim_check: ClaimCheckConfig, run_id: str = "default"):
        if not kafka.bootstrap_servers:
            raise ValueError(
                "kafka.bootstrap_servers is not set; start an EmbeddedBroker first "
                "(rlbus does this for you in `rlbus run`/`quickstart`)"
            )
        self.kafka = kafka
        self.run_id = run_id
        self.claims = ClaimStore(claim_check)
        self.topics = Topics(kafka)
        self.publisher = Publisher(kafka, self.topics, self.claims, run_id)
        self._watch: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, settings: Settings) -> Bus:
        """The bus of a process configured by `settings`."""
        return cls(settings.kafka, settings.claim_check, settings.run_id)

    async def start(self) -> Bus:
        quiet_kafka_client()
        await self.publisher.start()
        await self.topics.start()
        self._watch = asyncio.create_task(
            watch_broker(self.kafka.bootstrap_servers or "", self.run_id)
        )
        return self

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        # Bounded: with the broker gone, flushing and closing would wait out every retry.
        for closing in (self.publisher.stop(), self.topics.stop()):
            try:
                await asyncio.wait_for(closing, STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning(
                    "the bus did not close within %gs (is the broker gone?)", STOP_TIMEOUT_S
                )
        if self.kafka.ack_ledger and self.publisher.acked:
            write_ledger(Path(self.kafka.ack_ledger), self.publisher.acked)

    async def __aenter__(self) -> Bus:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def publish(self, event: Event) -> None:
        """Publish one event and wait for the broker's acknowledgement."""
        await self.publisher.publish_many([event])

    async def publish_many(
        self, events: Sequence[Event], parents: Mapping[str, Context | None] | None = None
    ) -> None:
        """Publish events (any topics) and wait until the broker acknowledged all of them;
        `parents`: each event's trace context by event id (Publisher.publish_many)."""
        await self.publisher.publish_many(events, parents)

    async def publish_raw(
        self, topic: str, value: bytes, key: bytes | None = None, headers: Headers | None = None
    ) -> None:
        """Publish bytes as they are (tests, bridges); `topic` is unprefixed."""
        await self.publisher.publish_raw(topic, value, key, headers)

    async def ensure_topics(self, names: Sequence[str]) -> None:
        """Create the named (unprefixed) topics that do not exist yet."""
        await self.topics.ensure(names)

    @overload
    def subscriber(
        self, *topics: str, group: str, batch: Literal[True], **options: Any
    ) -> Callable[[BatchHandler], BatchSubscriber]: ...

    @overload
    def subscriber(
        self, *topics: str, group: str, batch: Literal[False] = False, **options: Any
    ) -> Callable[[EventHandler], EventSubscriber]: ...

    def subscriber(
        self, *topics: str, group: str, batch: bool = False, **options: Any
    ) -> Callable[[Any], BatchSubscriber | EventSubscriber]:
        """A decorator making a handler a consumer-group member of `group` on `topics`
        (unprefixed). `batch=True`: the handler takes every delivery of a poll
        (`batch_rows`, `batch_wait_s`); else one delivery, up to `concurrency` at once. Both
        take `max_records`, `poll_timeout_ms`, `dedup` (drop redelivered event ids),
        `on_error` ("dead_letter" or "stop") and `run` (handle only that run's events; others
        are counted in the subscriber's `other_runs` and committed past)."""

        def make(handler: Any) -> BatchSubscriber | EventSubscriber:
            kind = BatchSubscriber if batch else EventSubscriber
            return kind(self, topics, group, handler, **options)

        return make
