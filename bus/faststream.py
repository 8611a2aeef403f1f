"""FastStream apps on rlbus topics: users' own consumers (an alert, a custom reward, a mirror
into another system) receive rlbus's events decoded and publish events encoded as rlbus
publishes them (bus.messages: msgpack or JSON in, claim checks resolved; msgpack out).

    rl = FastStreamBus.of(settings)
    app = rl.app()

    @rl.subscriber("scored", group="alerts")
    async def alert(event: RolloutScored) -> None:
        if event.reward < 0.1:
            await rl.publish(...)

Acknowledgement is at least once: a message is committed after its handler returned
(`AckPolicy.ACK`, not FastStream's Kafka default of committing first). A message that does
not decode, or whose handler raised, goes to `dlq` with the reason, as rlbus's own consumers
do, and is then committed past: one bad event never stops the consumer.
"""

from __future__ import annotations

import asyncio
import copy
import json
import traceback
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Union

import msgspec
from aiokafka import ConsumerRecord
from fast_depends.msgspec import MsgSpecSerializer
from faststream import AckPolicy, FastStream
from faststream.exceptions import AckMessage, HandlerException
from faststream.kafka import KafkaBroker, KafkaMessage
from faststream.middlewares import BaseMiddleware
from faststream.security import BaseSecurity, SASLPlaintext, SASLScram256, SASLScram512
from faststream.specification import AsyncAPI
from pydantic import BaseModel

from rlbus.bus.claim_check import ClaimStore
from rlbus.bus.connection import client_options, fetch_options
from rlbus.bus.middleware import DeadLetters
from rlbus.bus.publisher import Topics
from rlbus.bus.records import from_record, to_message
from rlbus.config import ClaimCheckConfig, KafkaConfig, Settings
from rlbus.schemas import BY_NAME, TOPICS, Event, Topic, codec

HANDED = "rlbus_handed"
"""The StreamMessage attribute naming the records a handler was given (dead-lettered if it
raises)."""


_SASL = {"PLAIN": SASLPlaintext, "SCRAM-SHA-256": SASLScram256, "SCRAM-SHA-512": SASLScram512}


def broker_security(kafka: KafkaConfig) -> BaseSecurity | None:
    """KafkaConfig's TLS and SASL settings in FastStream's terms: the same connection every rlbus
    client makes (bus.connection.client_options, which also checks them)."""
    if kafka.security_protocol == "PLAINTEXT":
        return None
    options = client_options(kafka)
    context = options.get("ssl_context")
    if kafka.security_protocol == "SSL":
        return BaseSecurity(ssl_context=context)
    return _SASL[kafka.sasl_mechanism](
        options["sasl_plain_username"], options["sasl_plain_password"], ssl_context=context
    )


class FastStreamBus:
    """A FastStream Kafka broker on rlbus's topics: subscribers decode rlbus events,
    `publish` encodes them, failures become dead letters."""

    def __init__(
        self,
        kafka: KafkaConfig,
        claim_check: ClaimCheckConfig,
        run_id: str = "default",
        **broker_options: Any,
    ):
        if not kafka.bootstrap_servers:
            raise ValueError(
                "kafka.bootstrap_servers is not set: point it at the run's broker "
                "(`rlbus broker` prints the address)"
            )
        self.kafka = kafka
        self.run_id = run_id
        self.claims = ClaimStore(claim_check)
        self.topics = Topics(kafka)
        self.broker = KafkaBroker(
            kafka.bootstrap_servers,
            security=broker_security(kafka),
            acks="all",
            max_request_size=kafka.max_request_size,
            # Handlers are annotated with rlbus's msgspec Structs.
            serializer=MsgSpecSerializer(),
            middlewares=[self._dead_letter_middleware()],
            **broker_options,
        )

    @classmethod
    def of(cls, settings: Settings, **broker_options: Any) -> FastStreamBus:
        """The FastStream bus of a process configured by `settings`."""
        return cls(settings.kafka, settings.claim_check, settings.run_id, **broker_options)

    def app(self, **options: Any) -> FastStream:
        """A FastStream application serving this bus (`faststream run module:app`); it creates
        the rlbus topics it will use before the broker starts."""
        app = FastStream(self.broker, **options)
        app.on_startup(self.ensure_topics)
        return app

    async def ensure_topics(self) -> None:
        """Create every rlbus topic that does not exist yet (subscribers of a missing topic
        would wait for it)."""
        await self.topics.start()
        try:
            await self.topics.ensure([t.name for t in TOPICS])
        finally:
            await self.topics.stop()

    def subscriber(
        self,
        *topics: str,
        group: str,
        batch: bool = False,
        run: str | None = None,
        **options: Any,
    ) -> Any:
        """A FastStream subscriber of `topics` (unprefixed rlbus names) in consumer group
        `group`, reading from the earliest uncommitted message. The handler takes one event
        (or, with `batch=True`, a list of them) typed as rlbus's event classes; batched topics
        (trace-nodes, tokens: a message holds a rollout's events) take `batch=True`. `run`: handle
        only that run's events (others are committed past, unhandled). Other keywords go to
        FastStream's `KafkaBroker.subscriber`."""
        unknown = [t for t in topics if t not in BY_NAME]
        if unknown or not topics:
            raise ValueError(f"unknown topics {unknown or '(none)'}; known: {sorted(BY_NAME)}")
        batched = [t for t in topics if BY_NAME[t].batched]
        if batched and not batch:
            raise ValueError(
                f"a message on {', '.join(batched)} holds a rollout's events of that kind (a "
                "list): subscribe with batch=True and take list[...] "
                "(docs/kafka-clients.md: batched topics)"
            )
        options = fetch_options(self.kafka) | options
        options.setdefault("ack_policy", AckPolicy.ACK)
        options.setdefault("auto_offset_reset", "earliest")
        options.setdefault("max_partition_fetch_bytes", self.kafka.max_request_size)
        return self.broker.subscriber(
            *[self.topics.name(t) for t in topics],
            group_id=self.kafka.topic_prefix + group,
            batch=batch,
            decoder=self._decoder(group, run, batch),
            **options,
        )

    async def publish(self, *events: Event) -> None:
        """Publish events (any topics) as rlbus publishes them, and wait until the broker
        acknowledged every one. An event naming no run belongs to this bus's run."""
        sends = []
        for event in events:
            if not event.run_id:
                event.run_id = self.run_id
            m = to_message(event, self.claims)
            sends.append(
                self.broker.publish(
                    m.value,
                    self.topics.name(m.topic),
                    key=m.key,
                    headers={name: value.decode() for name, value in m.headers},
                )
            )
        await asyncio.gather(*sends)

    def _decoder(self, group: str, run: str | None, batch: bool) -> Callable[..., Any]:
        async def decode(message: KafkaMessage) -> Event | list[Event]:
            raw = message.raw_message
            records = raw if isinstance(raw, tuple) else (raw,)
            letters = DeadLetters(group, self.kafka.topic_prefix)
            handed: list[ConsumerRecord] = []
            events: list[Event] = []
            for record in records:
                topic = record.topic[len(self.kafka.topic_prefix) :]
                try:
                    decoded = from_record(topic, record, self.claims)
                except Exception as exc:  # whatever stops a decode makes a dead letter
                    letters.add(topic, record, f"decode: {exc}")
                    continue
                mine = [event for event in decoded if run is None or event.run_id == run]
                if mine:
                    handed.append(record)
                    events += mine
            if dead := letters.take():
                await self.publish(*dead)
            setattr(message, HANDED, handed)
            if batch:
                return events
            if not events:
                raise AckMessage()  # dead-lettered or another run's: committed past, unhandled
            return events[0]

        return decode

    def _dead_letter_middleware(self) -> Callable[..., BaseMiddleware]:
        fs_bus = self

        class DeadLetterOnError(BaseMiddleware):
            """A handler that raised: its records go to `dlq` with the error; the exception is
            then swallowed, so the acknowledgement policy commits past them."""

            async def after_processed(
                self,
                exc_type: type[BaseException] | None = None,
                exc_val: BaseException | None = None,
                exc_tb: TracebackType | None = None,
            ) -> bool | None:
                if not isinstance(exc_val, Exception) or isinstance(exc_val, HandlerException):
                    return False
                message = self.context.get_local("message")
                records: Iterable[ConsumerRecord] = getattr(message, HANDED, ())
                subscriber = self.context.get_local("handler_")
                group = str(getattr(subscriber, "group_id", "") or "")
                prefix = fs_bus.kafka.topic_prefix
                letters = DeadLetters(group.removeprefix(prefix), prefix)
                trace = "".join(traceback.format_exception(exc_val, limit=5))
                for record in records:
                    letters.add(record.topic[len(prefix) :], record, f"handler: {trace}")
                if not (dead := letters.take()):
                    return False
                await fs_bus.publish(*dead)
                return True

        return DeadLetterOnError


PLACEHOLDER_SERVER = "127.0.0.1:9092"
"""The server named in the AsyncAPI document when no broker is configured (the embedded broker
listens on a free loopback port chosen when it starts)."""


def _payload(topic: Topic) -> type[BaseModel]:
    """A pydantic stand-in whose JSON Schema is msgspec's for the topic's messages: FastStream
    builds payload schemas through pydantic, which cannot describe msgspec Structs (FastStream
    issue #2101), so the events stay defined once, as Structs."""
    kinds = topic.kinds
    event = kinds[0] if len(kinds) == 1 else Union[kinds]  # noqa: UP007
    # A batched topic's message is one event or an array of them (one rollout's, one publish).
    shape = Union[event, list[event]] if topic.batched else event  # noqa: UP007
    single = shape is kinds[0]
    (top,), defs = msgspec.json.schema_components([shape], ref_template="#/$defs/{name}")
    name = kinds[0].__name__ if single else "".join(w.title() for w in topic.name.split("-"))
    schema = {**(defs.pop(name) if single else top), "title": name, "$defs": defs}

    def model_json_schema(cls: type[BaseModel], *args: Any, **kwargs: Any) -> dict[str, Any]:
        return copy.deepcopy(schema)

    return type(name, (BaseModel,), {"model_json_schema": classmethod(model_json_schema)})


def _describe(topic: Topic) -> str:
    kinds = ", ".join(k.__name__ for k in topic.kinds)
    readers = ", ".join(topic.groups)
    json_note = (
        "; JSON objects from any Kafka client are accepted too" if topic.accepts_json else ""
    )
    batched_note = (
        " A message holds one event or a msgpack array of events of one key (what one rollout "
        "produced in one publish)."
        if topic.batched
        else ""
    )
    return (
        f"Events: {kinds}. Kafka key: the event's `{topic.key_field}` (equal keys share a "
        f"partition). Read by rlbus's roles: {readers}. Values are msgpack (header `content-type: "
        f"{codec.MSGPACK}`{json_note}); header `rlbus-kind` names the event class; an event "
        f"over the claim-check threshold travels as a stub whose `rlbus-claim-check` header "
        f"holds its URI.{batched_note}"
    )


def asyncapi_document(kafka: KafkaConfig, version: str) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of every rlbus topic, its key and its events, generated by
    FastStream from a broker declaring one subscriber and one publisher per topic."""
    broker = KafkaBroker(kafka.bootstrap_servers or PLACEHOLDER_SERVER)
    keys: dict[str, str] = {}
    for topic in TOPICS:
        payload = _payload(topic)
        address = kafka.topic_prefix + topic.name
        description = _describe(topic)

        async def handler(event: Any) -> None:
            """Never called: the signature is what FastStream documents."""

        handler.__annotations__ = {"event": payload, "return": None}
        broker.subscriber(address, title=topic.name, description=description)(handler)
        broker.publisher(
            address, title=f"{topic.name}:publish", description=description, schema=payload
        )
        keys[topic.name] = topic.key_field
    spec = AsyncAPI(
        broker,
        title="rlbus",
        version=version,
        description="Every topic of rlbus's event log (docs/architecture.md: Topics). "
        "Consume them with "
        "rlbus.bus.faststream.FastStreamBus.",
    ).to_specification()
    document: dict[str, Any] = json.loads(spec.to_json())
    # FastStream lists endpoints in no stable order; sorted, the document diffs cleanly.
    for section in (document, document["components"]):
        for name in ("channels", "operations", "messages", "schemas"):
            if name in section:
                section[name] = dict(sorted(section[name].items()))
    # FastStream writes JSON as the default and has no place for Kafka keys: both said here.
    document["defaultContentType"] = codec.MSGPACK
    for name, message in document["components"]["messages"].items():
        field = keys[name.split(":")[0]]
        key = {"type": "string", "description": f"the event's `{field}`"}
        message["bindings"] = {"kafka": {"key": key, "bindingVersion": "0.5.0"}}
    return document
