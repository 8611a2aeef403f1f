"""Events as a Kafka message and back: a msgpack value (one event, or on a batched topic an
array of one key's events), `content-type` and `rlbus-kind` headers, W3C trace context, and
the claim check for payloads over the threshold. JSON from outside clients is accepted on the
topics that allow it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from aiokafka import ConsumerRecord

from rlbus.bus import telemetry
from rlbus.bus.claim_check import HEADER as CLAIM_HEADER
from rlbus.bus.claim_check import ClaimError, ClaimStore, ClaimStub
from rlbus.schemas import Event, codec, key_of, topic_of

CONTENT_TYPE = "content-type"
KIND = "rlbus-kind"

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    """Topic name without the configured prefix."""
    key: bytes
    value: bytes
    headers: Headers


_MSGPACK = codec.MSGPACK.encode()


def events_by_message(events: Sequence[Event]) -> list[list[Event]]:
    """The events of one publish as messages, in order of first appearance: on a batched topic
    one message per key (a rollout's trace nodes together), elsewhere one per event."""
    out: list[list[Event]] = []
    open_: dict[tuple[str, bytes], list[Event]] = {}
    for event in events:
        topic = topic_of(event)
        if not topic.batched:
            out.append([event])
            continue
        where = (topic.name, key_of(event))
        group = open_.get(where)
        if group is None:
            group = open_[where] = []
            out.append(group)
        group.append(event)
    return out


def to_message(event: Event, claims: ClaimStore) -> Message:
    """Encode an event; a payload over the claim-check threshold is stored and replaced by a
    stub."""
    return to_batch_message([event], claims)


def to_batch_message(events: Sequence[Event], claims: ClaimStore) -> Message:
    """One message for events of one kind and key (several only on a batched topic: what one
    rollout produces), encoded once; the first event names it (claim check)."""
    first = events[0]
    topic = topic_of(first).name
    kind = type(first).__name__
    value = codec.encode_many(events)
    headers: Headers = [(CONTENT_TYPE, _MSGPACK), (KIND, kind.encode())]
    if claims.needed(value):
        key = claims.put(topic, first.event_id, value)
        headers.append((CLAIM_HEADER, key.encode()))
        value = msgspec.msgpack.encode(ClaimStub(kind, first.event_id, key, len(value)))
    if telemetry.enabled():
        telemetry.inject_headers(headers)
    return Message(topic, key_of(first), value, headers)


def from_record(topic: str, record: ConsumerRecord, claims: ClaimStore) -> list[Event]:
    """The events of a consumed record of `topic` (unprefixed): one, or several on a batched
    topic. Raises with a reason a person can act on (schemas.DecodeError, or ClaimError for a
    claim reference that is not read)."""
    headers = dict(record.headers or ())
    raw = record.value or b""
    if CLAIM_HEADER in headers:
        reference = headers[CLAIM_HEADER].decode(errors="replace")
        try:
            stub = msgspec.msgpack.decode(raw, type=ClaimStub)
        except msgspec.DecodeError as exc:
            raise ClaimError(
                f"a claim-check message whose value is not a claim stub: {exc}"
            ) from None
        if stub.key != reference:
            raise ClaimError(
                f"claim header {reference[:200]!r} and stub {stub.key[:200]!r} name "
                "different claims"
            )
        raw = claims.get(stub.key, stub.size)
    content_type = headers.get(CONTENT_TYPE)
    return codec.decode_all(topic, raw, content_type.decode() if content_type else None)
