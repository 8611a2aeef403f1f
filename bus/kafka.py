"""Publishing and consuming typed events on Kafka (aiokafka), at least once.

- Offsets are committed only after the handler returned, i.e. after its output was
  published (awaited) or stored. A crash redelivers; consumers dedup by `event_id`.
- A message that cannot be decoded, or whose handling fails on its own, goes to the
  dead-letter topic with the reason, raw bytes and origin position; the consumer goes on.
- Topics are created on first use with the configured partition count.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import CommitFailedError, TopicAlreadyExistsError
from aiokafka.structs import OffsetAndMetadata
from opentelemetry.trace import SpanKind

from rlbus.bus import telemetry
from rlbus.bus.claim_check import HEADER as CLAIM_HEADER
from rlbus.bus.claim_check import ClaimStore, ClaimStub
from rlbus.config import Settings
from rlbus.schemas import BY_NAME, DeadLetter, Event, codec, derived_id, key_of, topic_of

log = logging.getLogger(__name__)

CONTENT_TYPE = "content-type"
KIND = "rlbus-kind"


class Holds:
    """Offsets taken but not finished: a judge's incomplete group, an env producer's rollout
    still running. No partition is committed past its oldest held offset, so after a crash
    those messages come back instead of being lost with the handler's memory. Counted, so the
    consumer's own hold on a running event and a handler's `Delivery.hold()` are independent."""

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

    def limit(self, topic: str, partition: int) -> int | None:
        """The oldest held offset of a partition, if any."""
        held = self._held.get((topic, partition))
        return min(held) if held else None


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

    def hold(self) -> None:
        """Keep this message uncommitted after the handler returns, until `release()`."""
        if self.holds is not None:
            self.holds.add(self.topic, self.partition, self.offset)

    def release(self) -> None:
        """Done with a held message: its partition may be committed past it again."""
        if self.holds is not None:
            self.holds.discard(self.topic, self.partition, self.offset)


BatchHandler = Callable[[list[Delivery]], Awaitable[None]]
EventHandler = Callable[[Delivery], Awaitable[None]]


class _SeenIds:
    """Event ids already handled by this consumer, bounded (oldest forgotten first)."""

    def __init__(self, capacity: int = 200_000):
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def add(self, event_id: str) -> bool:
        """True when the id is new."""
        if event_id in self._ids:
            return False
        self._ids[event_id] = None
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        return True


class Bus:
    """A producer plus topic administration for one process; consumers are started from it.

    async with Bus(settings) as bus:
        await bus.publish(TaskPublished(...))
        await bus.consume("judge", ["rollouts"], on_event=handle, stop=stop_event)
    """

    def __init__(self, settings: Settings):
        if not settings.kafka.bootstrap_servers:
            raise ValueError(
                "kafka.bootstrap_servers is not set; start an EmbeddedBroker first "
                "(rlbus does this for you in `rlbus run`/`quickstart`)"
            )
        self.settings = settings
        self.bootstrap = settings.kafka.bootstrap_servers
        self.claims = ClaimStore(settings.claim_check.url, settings.claim_check.threshold_bytes)
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._ensured: set[str] = set()
        self._ensure_lock = asyncio.Lock()

    def topic(self, name: str) -> str:
        return self.settings.kafka.topic_prefix + name

    async def start(self) -> Bus:
        kafka = self.settings.kafka
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=False,  # unsupported by the embedded broker; consumers dedup instead
            linger_ms=kafka.linger_ms,
            max_batch_size=1024 * 1024,
            max_request_size=kafka.max_request_size,
        )
        await self._producer.start()
        self._admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await self._admin.start()
        return self

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._admin is not None:
            await self._admin.close()
            self._admin = None

    async def __aenter__(self) -> Bus:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def admin(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            raise RuntimeError("Bus is not started: use `async with Bus(settings) as bus`")
        return self._admin

    async def ensure_topics(self, names: Iterable[str]) -> None:
        """Create the named (unprefixed) topics that do not exist yet."""
        wanted = [n for n in names if n not in self._ensured]
        if not wanted:
            return
        async with self._ensure_lock:
            existing = set(await self.admin.list_topics())
            missing = [self.topic(n) for n in wanted if self.topic(n) not in existing]
            if missing:
                kafka = self.settings.kafka
                try:
                    await self.admin.create_topics(
                        [NewTopic(t, kafka.partitions, kafka.replication_factor) for t in missing]
                    )
                except TopicAlreadyExistsError:
                    pass  # another process won the race; the topic is there either way
            self._ensured.update(wanted)

    # -- publishing -----------------------------------------------------------------

    def _message(self, event: Event) -> tuple[str, bytes, bytes, list[tuple[str, bytes]]]:
        if not event.run_id:
            event.run_id = self.settings.run_id
        topic = topic_of(event).name
        kind = type(event).__name__
        payload = codec.encode(event)
        headers: list[tuple[str, bytes]] = [
            (CONTENT_TYPE, codec.MSGPACK.encode()),
            (KIND, kind.encode()),
        ]
        if self.claims.needed(payload):
            uri = self.claims.put(topic, event.event_id, payload)
            headers.append((CLAIM_HEADER, uri.encode()))
            payload = msgspec.msgpack.encode(ClaimStub(kind, event.event_id, uri, len(payload)))
        if telemetry.enabled():
            telemetry.inject_headers(headers)
        return topic, key_of(event), payload, headers

    async def publish(self, event: Event) -> None:
        """Publish one event and wait for the broker's acknowledgement."""
        await self.publish_many([event])

    async def publish_many(self, events: Sequence[Event]) -> None:
        """Publish events (any topics) and wait until the broker acknowledged all of them."""
        if self._producer is None:
            raise RuntimeError("Bus is not started: use `async with Bus(settings) as bus`")
        await self.ensure_topics({topic_of(e).name for e in events})
        futures = []
        for event in events:
            with telemetry.span(
                f"publish {topic_of(event).name}",
                SpanKind.PRODUCER,
                attributes={"messaging.system": "kafka", "rlbus.event_id": event.event_id},
            ):
                topic, key, payload, headers = self._message(event)
                futures.append(
                    await self._producer.send(self.topic(topic), payload, key=key, headers=headers)
                )
        if futures:
            await asyncio.gather(*futures)

    async def keep_announcing(
        self, latest: Callable[[], Event | None], stop: asyncio.Event
    ) -> None:
        """Re-publish `latest()` (a state event: the trainer's WeightVersion, an inference
        worker's WeightLoaded) every kafka.announce_every_s until `stop`. A consumer that
        restarted past the original learns the state from the next one; it is the same event
        (same id) each time, so stores and running consumers drop the repeats."""
        every_s = self.settings.kafka.announce_every_s
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                event = latest()
                if event is not None:
                    await self.publish(event)

    async def publish_raw(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Publish bytes as they are (tests, bridges); `topic` is unprefixed."""
        if self._producer is None:
            raise RuntimeError("Bus is not started")
        await self.ensure_topics([topic])
        await self._producer.send_and_wait(self.topic(topic), value, key=key, headers=headers or [])

    # -- consuming ------------------------------------------------------------------

    def _decode(self, topic: str, record: ConsumerRecord) -> Event:
        headers = dict(record.headers or ())
        raw = record.value or b""
        if CLAIM_HEADER in headers:
            raw = self.claims.get(headers[CLAIM_HEADER].decode())
        content_type = headers.get(CONTENT_TYPE)
        return codec.decode(
            topic,
            raw,
            content_type.decode() if content_type else None,
            # A JSON event from an outside client may carry no id: derive one from its
            # position, so a redelivery of the same message keeps the same id.
            fallback_event_id=lambda: derived_id(
                self.topic(topic), record.partition, record.offset
            ),
        )

    def _dead_letter(
        self, group: str, topic: str, record: ConsumerRecord, error: str
    ) -> DeadLetter:
        return DeadLetter(
            event_id=derived_id("dlq", group, self.topic(topic), record.partition, record.offset),
            origin_topic=topic,
            origin_partition=record.partition,
            origin_offset=record.offset,
            consumer_group=group,
            error=error,
            raw=record.value or b"",
            key=record.key or b"",
        )

    async def consume(
        self,
        group: str,
        topics: Sequence[str],
        *,
        on_batch: BatchHandler | None = None,
        on_event: EventHandler | None = None,
        stop: asyncio.Event | None = None,
        max_records: int | None = None,
        concurrency: int | None = None,
        poll_timeout_ms: int = 200,
        batch_rows: int = 1,
        batch_wait_s: float = 0.0,
        dedup: bool = True,
        handler_errors: Literal["dead_letter", "raise"] = "dead_letter",
    ) -> None:
        """Consume `topics` (unprefixed) as consumer group `group` until `stop` is set.

        `on_batch`: one call per poll (the sink, the orchestrator). Polls are gathered until
        `batch_rows` records or `batch_wait_s` since the first one; the next poll is fetched
        while a batch is handled; batches are handled in order, each committed after it.

        `on_event`: one call per event, up to `concurrency` at once, each in its own trace
        span. Polling goes on while handlers run, whenever a slot is free, so one slow event
        (a three-hour rollout) never stalls the others; each partition is committed up to its
        oldest event still running.

        `handler_errors="raise"` suits handlers whose failures are about infrastructure, not
        the event (the sink's store): the consumer stops uncommitted, and a restart
        redelivers, instead of dead-lettering good events.
        """
        if (on_batch is None) == (on_event is None):
            raise ValueError("give exactly one of on_batch or on_event")
        unknown = [t for t in topics if t not in BY_NAME]
        if unknown:
            raise ValueError(f"unknown topics {unknown}; known: {sorted(BY_NAME)}")
        stop = stop or asyncio.Event()
        await self.ensure_topics([*topics, "dlq"])
        kafka = self.settings.kafka
        consumer = AIOKafkaConsumer(
            *[self.topic(t) for t in topics],
            bootstrap_servers=self.bootstrap,
            group_id=self.settings.kafka.topic_prefix + group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=kafka.max_request_size,
            fetch_max_bytes=max(kafka.max_request_size, 50 * 1024 * 1024),
            max_poll_interval_ms=30 * 60 * 1000,
        )
        await consumer.start()
        position = _Position(self, consumer, group, seen=_SeenIds() if dedup else None)
        try:
            if on_event is not None:
                await self._consume_each(
                    position,
                    on_event,
                    stop,
                    concurrency or 64,
                    max_records or kafka.fetch_max_records,
                    poll_timeout_ms,
                    handler_errors,
                )
            else:
                assert on_batch is not None
                await self._consume_batches(
                    position,
                    on_batch,
                    stop,
                    max_records or kafka.fetch_max_records,
                    poll_timeout_ms,
                    batch_rows,
                    batch_wait_s,
                    handler_errors,
                )
        finally:
            await consumer.stop()

    async def _consume_batches(
        self,
        position: _Position,
        handle: BatchHandler,
        stop: asyncio.Event,
        max_records: int,
        poll_timeout_ms: int,
        batch_rows: int,
        batch_wait_s: float,
        handler_errors: Literal["dead_letter", "raise"],
    ) -> None:
        in_flight: asyncio.Task[None] | None = None

        async def finish(
            good: list[tuple[ConsumerRecord, Delivery]],
            dead: list[DeadLetter],
            offsets: dict[TopicPartition, int],
        ) -> None:
            if good and handler_errors == "raise":
                await handle([d for _, d in good])
            elif good:
                dead.extend(await self._handle(position.group, handle, good))
            position.progress.update(offsets)
            await position.commit(dead)

        try:
            while not stop.is_set():
                polled = await self._gather(
                    position.consumer, stop, poll_timeout_ms, max_records, batch_rows, batch_wait_s
                )
                if in_flight is not None and in_flight.done():
                    in_flight.result()  # a failed batch stops the consumer now, not after the next poll
                if not polled:
                    continue
                good, dead = position.decode(polled)
                offsets = {tp: records[-1].offset + 1 for tp, records in polled.items()}
                if in_flight is not None:
                    await in_flight
                in_flight = asyncio.create_task(finish(good, dead, offsets))
            if in_flight is not None:
                await in_flight
        finally:
            if in_flight is not None and not in_flight.done():
                in_flight.cancel()  # uncommitted: redelivered to whoever consumes next
                await asyncio.gather(in_flight, return_exceptions=True)

    async def _consume_each(
        self,
        position: _Position,
        on_event: EventHandler,
        stop: asyncio.Event,
        concurrency: int,
        max_records: int,
        poll_timeout_ms: int,
        handler_errors: Literal["dead_letter", "raise"],
    ) -> None:
        running: set[asyncio.Task[None]] = set()
        dead: list[DeadLetter] = []
        finished = 0

        async def run(record: ConsumerRecord, d: Delivery) -> None:
            nonlocal finished
            parent = telemetry.extract_context(d.headers) if telemetry.enabled() else None
            try:
                with telemetry.span(
                    f"process {d.topic}",
                    SpanKind.CONSUMER,
                    parent=parent,
                    attributes={"messaging.system": "kafka", "rlbus.event_id": d.event.event_id},
                ):
                    await on_event(d)
            except Exception as exc:
                if handler_errors == "raise":
                    raise
                reason = f"handler: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
                dead.append(self._dead_letter(position.group, d.topic, record, reason))
            # Not in a `finally`: a handler cancelled at stop keeps its hold, so the commit
            # below never passes it and the event is redelivered.
            position.holds.discard(d.topic, d.partition, d.offset)
            finished += 1

        async def settle() -> None:
            """Commit every partition up to its oldest running event (dead letters out first)."""
            nonlocal finished
            for task in [t for t in running if t.done()]:
                running.discard(task)
                task.result()  # handler_errors="raise": stop the consumer, uncommitted
            if finished:
                finished = 0
                letters = dead[:]
                await position.commit(letters)
                del dead[: len(letters)]

        try:
            while not stop.is_set():
                await settle()
                free = concurrency - len(running)
                if free <= 0:
                    await asyncio.wait(
                        running, timeout=poll_timeout_ms / 1000, return_when=asyncio.FIRST_COMPLETED
                    )
                    continue
                polled = await position.consumer.getmany(
                    timeout_ms=poll_timeout_ms, max_records=min(free, max_records)
                )
                if not polled:
                    continue
                good, letters = position.decode(polled)
                dead.extend(letters)
                for record, d in good:
                    position.holds.add(d.topic, d.partition, d.offset)
                    running.add(asyncio.create_task(run(record, d)))
                for tp, records in polled.items():
                    position.progress[tp] = records[-1].offset + 1
                if letters or len(good) < sum(map(len, polled.values())):
                    finished += 1  # dead letters and duplicates alone still move the commit on
            await settle()
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    @staticmethod
    async def _gather(
        consumer: AIOKafkaConsumer,
        stop: asyncio.Event,
        poll_timeout_ms: int,
        max_records: int,
        batch_rows: int,
        batch_wait_s: float,
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        polled: dict[TopicPartition, list[ConsumerRecord]] = {}
        count = 0
        deadline: float | None = None
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            timeout_ms = poll_timeout_ms
            if deadline is not None:
                timeout_ms = max(0, int((deadline - loop.time()) * 1000))
            got = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            for tp, records in got.items():
                polled.setdefault(tp, []).extend(records)
                count += len(records)
            if count and deadline is None:
                deadline = loop.time() + batch_wait_s
            if count >= batch_rows or (deadline is not None and loop.time() >= deadline):
                break
            if not count:
                break  # nothing yet: let the caller check `stop` and poll again
        return polled

    async def _handle(
        self, group: str, handle: BatchHandler, good: list[tuple[ConsumerRecord, Delivery]]
    ) -> list[DeadLetter]:
        """Run the handler on the batch; if it fails, retry each delivery alone so one bad
        event does not sink its neighbours, and dead-letter those that still fail."""
        try:
            await handle([d for _, d in good])
            return []
        except Exception:
            log.warning(
                "batch handler failed on %d events; retrying one by one", len(good), exc_info=True
            )
        dead = []
        for record, delivery in good:
            try:
                await handle([delivery])
            except Exception as exc:
                reason = f"handler: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
                dead.append(self._dead_letter(group, delivery.topic, record, reason))
        return dead


class _Position:
    """One consumer's place in its partitions: decoding with dedup, the offsets handled so far,
    the held ones, and committing what may be committed."""

    def __init__(self, bus: Bus, consumer: AIOKafkaConsumer, group: str, seen: _SeenIds | None):
        self.bus = bus
        self.consumer = consumer
        self.group = group
        self.seen = seen
        self.holds = Holds()
        self.progress: dict[TopicPartition, int] = {}
        """Next offset to read, per partition, after the messages taken so far."""
        self.prefix = len(bus.settings.kafka.topic_prefix)

    def decode(
        self, polled: dict[TopicPartition, list[ConsumerRecord]]
    ) -> tuple[list[tuple[ConsumerRecord, Delivery]], list[DeadLetter]]:
        good: list[tuple[ConsumerRecord, Delivery]] = []
        dead: list[DeadLetter] = []
        for tp, records in polled.items():
            topic = tp.topic[self.prefix :]
            for record in records:
                try:
                    event = self.bus._decode(topic, record)
                except Exception as exc:
                    dead.append(self.bus._dead_letter(self.group, topic, record, f"decode: {exc}"))
                    continue
                if self.seen is not None and not self.seen.add(event.event_id):
                    continue
                good.append(
                    (
                        record,
                        Delivery(
                            event,
                            topic,
                            record.partition,
                            record.offset,
                            record.key,
                            tuple(record.headers or ()),
                            self.holds,
                        ),
                    )
                )
        return good, dead

    async def commit(self, dead_letters: Sequence[DeadLetter] = ()) -> None:
        """Publish `dead_letters` (their messages are among those committed), then commit."""
        if dead_letters:
            await self.bus.publish_many(dead_letters)
        assigned = self.consumer.assignment()
        for tp in [tp for tp in self.progress if tp not in assigned]:
            del self.progress[tp]  # revoked: its new owner resumes from the last commit
        commit = {}
        for tp, next_offset in self.progress.items():
            held = self.holds.limit(tp.topic[self.prefix :], tp.partition)
            commit[tp] = OffsetAndMetadata(
                next_offset if held is None else min(held, next_offset), ""
            )
        if not commit:
            return
        try:
            await self.consumer.commit(commit)
        except CommitFailedError:
            # A rebalance moved these partitions away meanwhile; their new owner redelivers
            # from the last commit, and handling is idempotent.
            log.warning(
                "commit failed after a rebalance in group %s; redelivered from the last commit",
                self.group,
            )
