"""An event as a Kafka message and back: a msgpack value, `content-type` and `rlbus-kind`
headers, W3C trace context, and the claim check for payloads over the threshold. JSON from
outside clients is accepted on the topics that allow it."""

from __future__ import annotations

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


def to_message(event: Event, claims: ClaimStore) -> Message:
    """Encode an event; a payload over the claim-check threshold is stored and replaced by a
    stub."""
    topic = topic_of(event).name
    kind = type(event).__name__
    value = codec.encode(event)
    headers: Headers = [(CONTENT_TYPE, codec.MSGPACK.encode()), (KIND, kind.encode())]
    if claims.needed(value):
        key = claims.put(topic, event.event_id, value)
        headers.append((CLAIM_HEADER, key.encode()))
        value = msgspec.msgpack.encode(ClaimStub(kind, event.event_id, key, len(value)))
    if telemetry.enabled():
        telemetry.inject_headers(headers)
    return Message(topic, key_of(event), value, headers)


def from_record(topic: str, record: ConsumerRecord, claims: ClaimStore) -> Event:
    """Decode a consumed record of `topic` (unprefixed). Raises with a reason a person can act
    on (schemas.DecodeError, or ClaimError for a claim reference that is not read)."""
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
    return codec.decode(topic, raw, content_type.decode() if content_type else None)
