"""Bytes <-> events. msgpack on the bus; JSON accepted where a topic allows outside clients."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, Union

import msgspec

from rlbus.schemas.events import Event
from rlbus.schemas.topics import BY_NAME, Topic

MSGPACK = "application/msgpack"
JSON = "application/json"

_encoder = msgspec.msgpack.Encoder()


class DecodeError(ValueError):
    """A message that is not a valid event for its topic; the reason is user-readable."""


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def _kind_type(topic: Topic) -> Any:
    return topic.kinds[0] if len(topic.kinds) == 1 else Union[topic.kinds]  # noqa: UP007


@cache
def _msgpack_decoder(topic_name: str) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(_kind_type(BY_NAME[topic_name]))


def sniff_json(raw: bytes) -> bool:
    return raw[:1] in (b"{", b" ", b"\n", b"\t", b"\r")


def decode(
    topic_name: str,
    raw: bytes,
    content_type: str | None = None,
    fallback_event_id: Callable[[], str] | None = None,
) -> Event:
    """Decode a message of `topic_name`.

    JSON is taken when the content-type says so or, with no content-type, when the
    bytes look like a JSON object, but only on topics that accept outside clients.
    `fallback_event_id` names a JSON event that carries no `event_id` (called only then):
    it should derive the id from the message's position so that a redelivery gets the same id.
    """
    topic = BY_NAME.get(topic_name)
    if topic is None:
        raise DecodeError(f"unknown topic {topic_name!r}; known: {sorted(BY_NAME)}")
    is_json = content_type == JSON or (content_type is None and sniff_json(raw))
    try:
        if not is_json:
            return _msgpack_decoder(topic_name).decode(raw)
        if not topic.accepts_json:
            raise DecodeError(f"topic {topic_name!r} takes msgpack events only, got JSON")
        obj = msgspec.json.decode(raw)
        if not isinstance(obj, dict):
            raise DecodeError(f"a JSON event must be an object, got {type(obj).__name__}")
        if fallback_event_id is not None and "event_id" not in obj:
            obj["event_id"] = fallback_event_id()
        return msgspec.convert(obj, _kind_type(topic))
    except msgspec.ValidationError as exc:
        raise DecodeError(f"invalid {topic_name!r} event: {exc}") from exc
    except msgspec.DecodeError as exc:
        fmt = "JSON" if is_json else "msgpack"
        raise DecodeError(f"undecodable {fmt} on {topic_name!r}: {exc}") from exc
