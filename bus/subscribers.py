"""Consuming events, at least once: FastStream's subscriber shapes with rlbus's commit rule.

    @bus.subscriber("rollouts", group="judge", batch=True)
    async def handle(batch: list[Delivery]) -> None: ...

    await handle.run(stop)

A `BatchSubscriber` hands over one poll at a time (the sink, the judge, the orchestrator); an
`EventSubscriber` one event at a time, up to `concurrency` at once (env producers). Either way a
partition is committed only up to its oldest message still running or held
(`Delivery.hold()`), after the handler's outputs were published or stored: a crash redelivers
what was not finished. At a stop, an event handler is cancelled unless its outputs began to go
out (bus.publisher.Sending): then it finishes and commits. FastStream acknowledges message by
message, so it has no committed prefix with holds; users' own consumers use FastStream, the core
roles these classes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import InvalidSessionTimeoutError

from rlbus.bus import progress
from rlbus.bus.commits import COMMIT_TIMEOUT_S, Holds, Offsets, Polled
from rlbus.bus.connection import client_options, fetch_options
from rlbus.bus.membership import group_options, leave_first_generation, session_refused
from rlbus.bus.middleware import DeadLetters, SeenIds, traced
from rlbus.bus.progress import PartitionProgress
from rlbus.bus.publisher import SENDING, Sending
from rlbus.bus.records import from_record
from rlbus.bus.unsent import until_taken
from rlbus.schemas import BY_NAME, Event

if TYPE_CHECKING:
    from rlbus.bus.bus import Bus

STOP_TIMEOUT_S = COMMIT_TIMEOUT_S

log = logging.getLogger(__name__)

OnError = Literal["dead_letter", "stop"]
"""What a handler's exception does: dead-letter the message and go on, or stop the consumer
uncommitted (for failures of infrastructure, not of the event: the sink's store going away
must not dead-letter good events)."""


@dataclass(slots=True)
class Delivery:
    """One decoded message and where it came from."""

    event: Event
    topic: str
    """Topic name without the prefix (e.g. "tasks")."""
    partition: int
    offset: int
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes]] = field(default_factory=tuple)
    holds: Holds | None = None
    record: ConsumerRecord | None = None
    dead: DeadLetters | None = None
    index: int | None = None
    """Its place among the events of a message that holds several (a batched topic); None
    when the message holds it alone."""

    def reject(self, reason: str) -> None:
        """Dead-letter this message with `reason` (it is bad, not the handler): it is committed
        past like a handled one, and published to `dlq` with that commit."""
        if self.dead is not None and self.record is not None:
            self.dead.add(self.topic, self.record, reason, self.index)

    def hold(self) -> None:
        """Keep this message uncommitted after the handler returns, until `release()`."""
        if self.holds is not None:
            self.holds.add(self.topic, self.partition, self.offset)

    def release(self) -> None:
        """Done with a held message: its partition may be committed past it again."""
        if self.holds is not None:
            self.holds.discard(self.topic, self.partition, self.offset)


def deliveries_of(
    topic: str,
    record: ConsumerRecord,
    events: Sequence[Event],
    holds: Holds | None = None,
    dead: DeadLetters | None = None,
) -> list[Delivery]:
    """A delivery per event of a decoded record (numbered when the record holds several)."""
    headers = tuple(record.headers or ())
    where = (topic, record.partition, record.offset, record.key, headers, holds, record, dead)
    if len(events) == 1:
        return [Delivery(events[0], *where)]
    return [Delivery(event, *where, index) for index, event in enumerate(events)]


BatchHandler = Callable[[list[Delivery]], Awaitable[None]]
EventHandler = Callable[[Delivery], Awaitable[None]]
H = TypeVar("H", BatchHandler, EventHandler)

Decoded = list[tuple[ConsumerRecord, Delivery]]


class Subscriber(Generic[H]):
    """One consumer-group member on `topics`; `run(stop)` consumes until `stop` is set."""

    def __init__(
        self,
        bus: Bus,
        topics: Sequence[str],
        group: str,
        handler: H,
        *,
        max_records: int | None = None,
        poll_timeout_ms: int = 200,
        dedup: bool = True,
        on_error: OnError = "dead_letter",
        run: str | None = None,
    ):
        unknown = [t for t in topics if t not in BY_NAME]
        if unknown:
            raise ValueError(f"unknown topics {unknown}; known: {sorted(BY_NAME)}")
        self.bus = bus
        self.topics = list(topics)
        self.group = group
        self.handler = handler
        self.max_records = max_records or bus.kafka.fetch_max_records
        self.poll_timeout_ms = poll_timeout_ms
        self.seen = SeenIds() if dedup else None
        self.finished_before: dict[TopicPartition, PartitionProgress] = {}
        """What an earlier member of the group finished past its commits (event subscribers)."""
        self.on_error = on_error
        self.serves = run
        """The run whose events this subscriber handles (None: every run's)."""
        self.other_runs: Counter[str] = Counter()
        """Events of other runs than `serves`, skipped (committed past, never handled), by run."""
        prefix = bus.kafka.topic_prefix
        self.dead = DeadLetters(group, prefix)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        kafka = self.bus.kafka
        await self.bus.topics.ensure([*self.topics, "dlq"])
        if stop.is_set():  # stopped while starting: no group to join and leave again
            return
        consumer = AIOKafkaConsumer(
            *[self.bus.topics.name(t) for t in self.topics],
            **client_options(kafka),
            **group_options(kafka),
            **fetch_options(kafka),
            group_id=kafka.topic_prefix + self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=kafka.max_request_size,
            fetch_max_bytes=max(kafka.max_request_size, 50 * 1024 * 1024),
        )
        await consumer.start()
        offsets = Offsets(consumer, kafka.topic_prefix, self.group)
        try:
            await self._consume(consumer, offsets, stop)
        except InvalidSessionTimeoutError as exc:
            raise session_refused(kafka, exc) from exc
        finally:
            try:
                # Its partitions move to the other members now, not after its session times out.
                await asyncio.wait_for(leave_first_generation(consumer), STOP_TIMEOUT_S)
                await asyncio.wait_for(consumer.stop(), STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("consumer of %s did not stop within %gs", self.group, STOP_TIMEOUT_S)

    async def _consume(
        self, consumer: AIOKafkaConsumer, offsets: Offsets, stop: asyncio.Event
    ) -> None:
        raise NotImplementedError

    def _decode(self, polled: Polled, holds: Holds) -> tuple[Decoded, bool]:
        """Deliveries of the polled records (one per event: a batched topic's message may hold
        several); undecodable ones become dead letters, redelivered ids are dropped. Also says
        whether anything was dropped or dead-lettered."""
        good: Decoded = []
        skipped = False
        prefix = self.bus.kafka.topic_prefix
        for tp, records in polled.items():
            topic = tp.topic[len(prefix) :]
            done = self.finished_before.get(tp)
            for record in records:
                if done is not None and done.finished(record.offset):
                    skipped = True  # handled before a restart: its outputs are published
                    continue
                try:
                    events = from_record(topic, record, self.bus.claims)
                except Exception as exc:  # whatever stops a decode makes a dead letter
                    self.dead.add(topic, record, f"decode: {exc}")
                    skipped = True
                    continue
                for delivery in deliveries_of(topic, record, events, holds, self.dead):
                    event = delivery.event
                    if self.seen is not None and not self.seen.add(event.event_id):
                        skipped = True
                        continue
                    if self.serves is not None and event.run_id != self.serves:
                        self._other_run(event)
                        skipped = True
                        continue
                    good.append((record, delivery))
        return good, skipped

    def _other_run(self, event: Event) -> None:
        if not self.other_runs[event.run_id]:
            log.info(
                "group %s serves run %r: skipping events of run %r (counted, not handled)",
                self.group,
                self.serves,
                event.run_id,
            )
        self.other_runs[event.run_id] += 1

    async def _until_the_broker_takes_it(
        self, handler: Callable[[Any], Awaitable[None]], arg: Any
    ) -> None:
        """Run the handler; when it fails on a broker error, run it again rather than
        dead-letter the event, which is not at fault. Its outputs have derived ids, so a repeat
        is deduplicated downstream; a stop meanwhile cancels it with its hold kept
        (redelivered)."""
        await until_taken(lambda: handler(arg), f"group {self.group}: the handler")

    async def _commit(self, offsets: Offsets) -> None:
        """Publish the dead letters (their messages are among those committed), then commit."""
        letters = self.dead.take()
        if letters:
            await self.bus.publish_many(letters)
        await offsets.commit()


class BatchSubscriber(Subscriber[BatchHandler]):
    """One handler call per poll. Polls are gathered until `batch_rows` records or
    `batch_wait_s` since the first one; the next poll is fetched while a batch is handled;
    batches are handled in order, each committed after it. A failing batch is retried one
    delivery at a time, so one bad event does not sink its neighbours."""

    def __init__(
        self,
        bus: Bus,
        topics: Sequence[str],
        group: str,
        handler: BatchHandler,
        *,
        batch_rows: int = 1,
        batch_wait_s: float = 0.0,
        **options: Any,
    ):
        super().__init__(bus, topics, group, handler, **options)
        self.batch_rows = batch_rows
        self.batch_wait_s = batch_wait_s

    async def _consume(
        self, consumer: AIOKafkaConsumer, offsets: Offsets, stop: asyncio.Event
    ) -> None:
        in_flight: asyncio.Task[None] | None = None

        async def finish(good: Decoded, polled: Polled) -> None:
            if good:
                await self._handle(good)
            offsets.taken(polled)
            await self._commit(offsets)

        try:
            while not stop.is_set():
                polled = await self._gather(consumer, stop)
                if in_flight is not None and in_flight.done():
                    in_flight.result()  # a failed batch stops the consumer now, not later
                if not polled:
                    continue
                good, _ = self._decode(polled, offsets.holds)
                if in_flight is not None:
                    await in_flight
                in_flight = asyncio.create_task(finish(good, polled))
            if in_flight is not None:
                await in_flight
        finally:
            if in_flight is not None and not in_flight.done():
                in_flight.cancel()  # uncommitted: redelivered to whoever consumes next
                await asyncio.gather(in_flight, return_exceptions=True)

    async def _gather(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> Polled:
        polled: Polled = {}
        count = 0
        deadline: float | None = None
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            timeout_ms = self.poll_timeout_ms
            if deadline is not None:
                timeout_ms = max(0, int((deadline - loop.time()) * 1000))
            got = await consumer.getmany(timeout_ms=timeout_ms, max_records=self.max_records)
            for tp, records in got.items():
                polled.setdefault(tp, []).extend(records)
                count += len(records)
            if count and deadline is None:
                deadline = loop.time() + self.batch_wait_s
            if count >= self.batch_rows or (deadline is not None and loop.time() >= deadline):
                break
            if not count:
                break  # nothing yet: let the caller check `stop` and poll again
        return polled

    async def _handle(self, good: Decoded) -> None:
        if self.on_error == "stop":
            await self.handler([d for _, d in good])
            return
        try:
            await self._until_the_broker_takes_it(self.handler, [d for _, d in good])
            return
        except Exception:
            log.warning(
                "batch handler failed on %d events; retrying one by one", len(good), exc_info=True
            )
        for record, delivery in good:
            try:
                await self._until_the_broker_takes_it(self.handler, [delivery])
            except Exception as exc:
                self.dead.add_failure(delivery.topic, record, exc, delivery.index)


class EventSubscriber(Subscriber[EventHandler]):
    """One handler call per event, up to `concurrency` at once, each in its own trace span.
    Polling goes on while handlers run, whenever a slot is free, so one slow event (a
    three-hour rollout) never stalls the others; each partition is committed up to its
    oldest event still running."""

    def __init__(
        self,
        bus: Bus,
        topics: Sequence[str],
        group: str,
        handler: EventHandler,
        *,
        concurrency: int = 64,
        **options: Any,
    ):
        super().__init__(bus, topics, group, traced(handler), **options)
        self.concurrency = concurrency

    async def _commit(self, offsets: Offsets) -> None:
        """Also record, per partition, what is still running below what was taken (bus.progress),
        before the commit that stops short of it."""
        for tp, upto, unfinished in offsets.unfinished():
            entry = PartitionProgress(self.group, tp.topic, tp.partition, upto, unfinished)
            await self.bus.publish_raw(
                progress.TOPIC, progress.encode_progress(entry), key=progress.key(self.group, tp)
            )
        await super()._commit(offsets)

    async def _load_progress(self, consumer: AIOKafkaConsumer) -> None:
        """On start and when handed partitions: what earlier members finished past the commits."""
        assigned = consumer.assignment()
        if assigned and not assigned <= self._loaded:
            self.finished_before = await progress.latest(self.bus, self.group)
            self._loaded = set(assigned)

    async def _consume(
        self, consumer: AIOKafkaConsumer, offsets: Offsets, stop: asyncio.Event
    ) -> None:
        running: dict[asyncio.Task[None], Sending] = {}
        finished = False
        """Something settled since the last commit: the commit can move on."""
        committing = asyncio.Lock()
        self._loaded: set[TopicPartition] = set()

        async def commit() -> None:
            nonlocal finished
            async with committing:
                if finished:
                    finished = False
                    await self._commit(offsets)

        async def run(record: ConsumerRecord, d: Delivery, sending: Sending) -> None:
            nonlocal finished
            SENDING.set(sending)  # this task's own context: the publisher marks it
            try:
                await self._until_the_broker_takes_it(self.handler, d)
            except Exception as exc:
                if self.on_error == "stop":
                    raise
                self.dead.add_failure(d.topic, record, exc, d.index)
            # Not in a `finally`: a handler cancelled at stop keeps its hold, so the commit
            # never passes it and the event is redelivered.
            offsets.holds.discard(d.topic, d.partition, d.offset)
            finished = True
            # At once, not at the next poll: a crash in between would run this event again.
            await commit()

        async def settle() -> None:
            for task in [t for t in running if t.done()]:
                del running[task]
                task.result()  # on_error="stop": stop the consumer, uncommitted
            await commit()

        try:
            while not stop.is_set():
                await settle()
                free = self.concurrency - len(running)
                if free <= 0:
                    timeout = self.poll_timeout_ms / 1000
                    await asyncio.wait(
                        running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                    )
                    continue
                polled = await consumer.getmany(
                    timeout_ms=self.poll_timeout_ms, max_records=min(free, self.max_records)
                )
                if not polled:
                    continue
                # The poll that joined the group may already bring a new partition's records:
                # what earlier members finished is read before any of them is decoded.
                await self._load_progress(consumer)
                good, skipped = self._decode(polled, offsets.holds)
                for record, d in good:
                    offsets.holds.add(d.topic, d.partition, d.offset)
                    sending = Sending()
                    running[asyncio.create_task(run(record, d, sending))] = sending
                offsets.taken(polled)
                finished = finished or skipped  # dead letters and duplicates move the commit too
            await settle()
        finally:
            # A handler whose outputs began to go out finishes and commits (Sending); the others
            # are cancelled with their holds kept, and run again by whoever consumes next.
            sent = [task for task, sending in running.items() if sending.begun]
            if sent:
                await asyncio.wait(sent, timeout=STOP_TIMEOUT_S)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
