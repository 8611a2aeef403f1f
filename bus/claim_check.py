"""Claim check: an encoded event over the size threshold is written to the claim store (a
folder at an fsspec URL) and the Kafka message carries only its key there (header
`rlbus-claim-check`, and a stub as the value), so no message nears the broker's size limit.
Consumers resolve the key before decoding, transparently.

Headers are not trusted: a reference is read only if it is a key under the configured claim
store (no scheme, no `..`, not absolute), names a regular file of exactly the size its stub
declares, at most `max_bytes`, and is read within `read_timeout_s`. Anything else raises
ClaimError, which consumers dead-letter with its reason.

Claims expire after `retention_s` and are deleted by the processes that write claims. Time,
not consumer progress, decides: the groups that will read a topic are not known in advance
(each run's roles have groups of their own, users' consumers have theirs, and restarting roles
read topics from the start outside any group), so "every group has passed it" cannot be known;
a message is readable for the topic's retention, and so is its claim if `retention_s` is at
least that.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import msgspec

from rlbus.bus.files import Folder
from rlbus.config import ClaimCheckConfig

HEADER = "rlbus-claim-check"

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_READERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rlbus-claim-read")
"""Reads run here so that one that hangs (a stalled remote store) costs a thread, not the
consumer: the consumer waits `read_timeout_s` and dead-letters the message."""


class ClaimStub(msgspec.Struct):
    """What travels on Kafka in place of a large event; enough to route and audit it."""

    kind: str
    event_id: str
    key: str
    """The claim's key under the claim store."""
    size: int
    """Bytes of the encoded event: the claim must be exactly this long."""


class ClaimError(ValueError):
    """A claim reference that is not read; the message says why."""


def claim_key(topic: str, event_id: str) -> str:
    """`topic/<event id>.msgpack`; an event id that is not a plain file name is hashed."""
    name = event_id if _NAME.fullmatch(event_id) and ".." not in event_id else None
    name = name or hashlib.blake2b(event_id.encode(), digest_size=16).hexdigest()
    return f"{topic}/{name}.msgpack"


def key_problem(key: str) -> str | None:
    """Why `key` is not a key under the claim store, or None."""
    if not key or len(key) > 1024:
        return "empty or longer than 1024 characters"
    if "://" in key or ":" in key:
        return "it has a scheme (a reference is a key under the claim store, not a URL)"
    if key.startswith("/") or "\\" in key or "\0" in key:
        return "it is an absolute path or holds a backslash or NUL"
    if any(part in ("", ".", "..") for part in key.split("/")):
        return "it has an empty, '.' or '..' component"
    return None


class ClaimStore:
    def __init__(self, config: ClaimCheckConfig):
        self.folder = Folder(config.url)
        self.config = config
        self.threshold_bytes = config.threshold_bytes
        self._swept = 0.0
        self._sweeping = threading.Lock()

    def needed(self, payload: bytes) -> bool:
        return len(payload) > self.threshold_bytes

    def put(self, topic: str, event_id: str, payload: bytes) -> str:
        """Write the payload and return its key. The name comes from the event id, so a
        retried publish overwrites rather than duplicates. Expired claims are deleted now
        and then on the way."""
        key = claim_key(topic, event_id)
        self.folder.write(key, payload)
        self._sweep_now_and_then()
        return key

    def get(self, key: str, size: int) -> bytes:
        """The claim at `key`, which must be a regular file of exactly `size` bytes; raises
        ClaimError with the reason otherwise, or when it is not read in time."""
        if problem := key_problem(key):
            raise ClaimError(f"claim reference {key[:200]!r} refused: {problem}")
        if not 0 <= size <= self.config.max_bytes:
            raise ClaimError(
                f"claim {key!r} declares {size} bytes; claims are read up to "
                f"claim_check.max_bytes = {self.config.max_bytes}"
            )
        reading = _READERS.submit(self.folder.read_regular, key, size)
        try:
            return reading.result(timeout=self.config.read_timeout_s)
        except FutureTimeout:
            raise ClaimError(
                f"claim {key!r} was not read within claim_check.read_timeout_s = "
                f"{self.config.read_timeout_s:g}s"
            ) from None
        except FileNotFoundError:
            raise ClaimError(
                f"claim {key!r} is not in the claim store {self.folder.url} (expired after "
                f"claim_check.retention_s = {self.config.retention_s:g}s, or never written)"
            ) from None
        except (OSError, ValueError) as exc:
            raise ClaimError(f"claim {key!r} refused: {exc}") from None

    def sweep(self, now: float | None = None) -> int:
        """Delete claims (and abandoned partial writes) older than the retention; returns how
        many were deleted."""
        cutoff = (time.time() if now is None else now) - self.config.retention_s
        deleted = self.folder.delete_older(cutoff)
        if deleted:
            log.info("deleted %d expired claims from %s", deleted, self.folder.url)
        return deleted

    def _sweep_now_and_then(self) -> None:
        every = min(self.config.retention_s / 10, 3600.0)
        now = time.monotonic()
        if now - self._swept < every or not self._sweeping.acquire(blocking=False):
            return
        try:
            self._swept = now
            self.sweep()
        except OSError as exc:  # the claim just written is safe; the next sweep tries again
            log.warning("could not delete expired claims from %s: %s", self.folder.url, exc)
        finally:
            self._sweeping.release()
