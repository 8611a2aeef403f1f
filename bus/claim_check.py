"""Claim check: an encoded event over the size threshold is written through fsspec and the
Kafka message carries only its URI (header `rlbus-claim-check`), so no message nears the
broker's size limit. Consumers resolve the URI before decoding, transparently."""

from __future__ import annotations

import os
import posixpath
import uuid

import fsspec
import msgspec

HEADER = "rlbus-claim-check"


class ClaimStub(msgspec.Struct):
    """What travels on Kafka in place of a large event; enough to route and audit it."""

    kind: str
    event_id: str
    uri: str
    size: int


def _absolute(url: str) -> str:
    """`file://./x` and bare relative paths become absolute, so another process (another cwd)
    resolves the same URI."""
    if "://" not in url:
        return "file://" + os.path.abspath(url)
    if url.startswith("file://") and not url.startswith("file:///"):
        return "file://" + os.path.abspath(url[len("file://") :])
    return url


class ClaimStore:
    def __init__(self, base_url: str, threshold_bytes: int):
        self.base_url = _absolute(base_url).rstrip("/")
        self.threshold_bytes = threshold_bytes

    def needed(self, payload: bytes) -> bool:
        return len(payload) > self.threshold_bytes

    def put(self, topic: str, event_id: str, payload: bytes) -> str:
        """Write the payload and return its URI. Written to a temporary name and renamed, so
        a reader never sees a partial file; the name is the event id, so a retried publish
        overwrites rather than duplicates."""
        uri = f"{self.base_url}/{topic}/{event_id}.msgpack"
        fs, path = fsspec.core.url_to_fs(uri)
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with fs.open(tmp, "wb") as f:
            f.write(payload)
        fs.mv(tmp, path)
        return uri

    @staticmethod
    def get(uri: str) -> bytes:
        with fsspec.open(uri, "rb") as f:
            return f.read()
