"""Bytes <-> events. msgpack on the bus; JSON accepted where a topic allows outside clients.

Every refusal is a DecodeError whose message says what was wrong in words a sender can act on
(it becomes the dead letter's reason)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from operator import attrgetter
from types import GenericAlias
from typing import Any, Union

import msgspec

from rlbus.schemas.events import DEFAULT_RUN, SCHEMA_VERSION, Event, TaskPublished
from rlbus.schemas.ids import task_event_id
from rlbus.schemas.topics import BY_NAME, Topic

MSGPACK = "application/msgpack"
JSON = "application/json"

_encoder = msgspec.msgpack.Encoder()


class DecodeError(ValueError):
    """A message that is not a valid event for its topic; the reason is user-readable."""


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def encode_many(events: Sequence[Event]) -> bytes:
    """One message's value for events of one batched topic and key: a msgpack array, or the
    event alone when there is one (what readers of one event per message also read)."""
    return _encoder.encode(events[0] if len(events) == 1 else list(events))


def _kind_type(topic: Topic) -> Any:
    return topic.kinds[0] if len(topic.kinds) == 1 else Union[topic.kinds]  # noqa: UP007


@cache
def _msgpack_decoder(topic_name: str, many: bool = False) -> msgspec.msgpack.Decoder:
    """One event of the topic, or (`many`: a batched topic's message, encode_many) an array of
    them. Two decoders, chosen by the first byte: a union of both decodes several times slower
    (docs/benchmarks.md)."""
    kind = _kind_type(BY_NAME[topic_name])
    return msgspec.msgpack.Decoder(GenericAlias(list, (kind,)) if many else kind)


_VERSION = attrgetter("schema_version")
_ARRAYS = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}
"""First bytes of a msgpack array (an event is a map)."""


def sniff_json(raw: bytes) -> bool:
    """Whether unlabelled bytes look like JSON text rather than msgpack (an rlbus event in
    msgpack starts with a map header, never with these)."""
    first = raw[:1]
    if first in (b" ", b"\n", b"\t", b"\r"):
        return True
    return first in (b"{", b"[", b'"')


def _looks_like_text(raw: bytes) -> bool:
    try:
        text = raw[:256].decode()
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\r\n\t" for c in text)


def _json_event(topic: Topic, raw: bytes) -> Event:
    if not topic.accepts_json:
        raise DecodeError(f"topic {topic.name!r} takes msgpack events only, got JSON")
    obj = msgspec.json.decode(raw)
    if not isinstance(obj, dict):
        raise DecodeError(f"a JSON event must be an object, got a JSON {type(obj).__name__}")
    if TaskPublished in topic.kinds:
        # An outside client's task may name no run and carry no id: it belongs to the default
        # run, and its id is its natural key, so sending the same task again collapses.
        obj.setdefault("run_id", DEFAULT_RUN)
        if "event_id" not in obj and isinstance(obj.get("task_id"), str | int):
            obj["event_id"] = task_event_id(obj["run_id"], obj.get("env", ""), str(obj["task_id"]))
    return msgspec.convert(obj, _kind_type(topic))


def decode(topic_name: str, raw: bytes, content_type: str | None = None) -> Event:
    """Decode a message of `topic_name` holding one event (see decode_all)."""
    events = decode_all(topic_name, raw, content_type)
    if len(events) != 1:
        raise DecodeError(f"a message of {len(events)} events on {topic_name!r}; expected one")
    return events[0]


def decode_all(topic_name: str, raw: bytes, content_type: str | None = None) -> list[Event]:
    """The events of a message of `topic_name`: one, or on a batched topic any number but none.

    JSON is taken when the content-type says so or, with no content-type, when the bytes look
    like JSON, but only on topics that accept outside clients. Events of a newer schema than
    this code reads are refused.
    """
    topic = BY_NAME.get(topic_name)
    if topic is None:
        raise DecodeError(f"unknown topic {topic_name!r}; known: {sorted(BY_NAME)}")
    is_json = content_type == JSON or (content_type is None and sniff_json(raw))
    try:
        many = topic.batched and bool(raw) and raw[0] in _ARRAYS
        got = _json_event(topic, raw) if is_json else _msgpack_decoder(topic_name, many).decode(raw)
    except msgspec.ValidationError as exc:
        if not is_json and content_type is None and _looks_like_text(raw):
            raise DecodeError(
                f"not an event on {topic_name!r}: the message is text ({raw[:40]!r}), neither an "
                f"rlbus msgpack event nor a JSON object"
            ) from exc
        raise DecodeError(f"invalid {topic_name!r} event: {exc}") from exc
    except msgspec.DecodeError as exc:
        fmt = "JSON" if is_json else "msgpack"
        raise DecodeError(f"undecodable {fmt} on {topic_name!r}: {exc}") from exc
    events = got if isinstance(got, list) else [got]
    if not events:
        raise DecodeError(f"an empty array of events on {topic_name!r}")
    if max(map(_VERSION, events)) > SCHEMA_VERSION:
        event = next(e for e in events if e.schema_version > SCHEMA_VERSION)
        raise DecodeError(
            f"{type(event).__name__} {event.event_id} has schema_version {event.schema_version}; "
            f"this rlbus reads up to {SCHEMA_VERSION} (upgrade the consumer)"
        )
    return events
