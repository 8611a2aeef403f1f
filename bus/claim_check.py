"""Claim check: an encoded event over the size threshold is written through fsspec and the
Kafka message carries only its URI (header `rlbus-claim-check`), so no message nears the
broker's size limit. Consumers resolve the URI before decoding, transparently."""

from __future__ import annotations

import fsspec
import msgspec

from rlbus.bus.files import Folder

HEADER = "rlbus-claim-check"


class ClaimStub(msgspec.Struct):
    """What travels on Kafka in place of a large event; enough to route and audit it."""

    kind: str
    event_id: str
    uri: str
    size: int


class ClaimStore:
    def __init__(self, base_url: str, threshold_bytes: int):
        self.folder = Folder(base_url)
        self.threshold_bytes = threshold_bytes

    def needed(self, payload: bytes) -> bool:
        return len(payload) > self.threshold_bytes

    def put(self, topic: str, event_id: str, payload: bytes) -> str:
        """Write the payload and return its URI. The name is the event id, so a retried
        publish overwrites rather than duplicates."""
        rel = f"{topic}/{event_id}.msgpack"
        self.folder.write(rel, payload)
        return self.folder.uri(rel)

    @staticmethod
    def get(uri: str) -> bytes:
        with fsspec.open(uri, "rb") as f:
            return f.read()
