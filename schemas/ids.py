"""Event identifiers, and the rules that make at-least-once delivery safe:

- a redelivery of the same record keeps its id; two different records never share one, across
  broker restarts: an id known only from where a message sat also covers its broker timestamp
  and a digest of its bytes (`record_id`);
- a task without an id takes its natural key, (run, env, task id) (`task_event_id`);
- an output derived from an input takes its id from (input id, producing run, sample or
  attempt) (`derived_id`; e.g. producers.rollouts.rollout_id_of);
- what a role makes once per step (a batch, a train step) takes (run, kind, step), plus the
  role's own incarnation when it resumed a run (`step_id`);
- new events get time-ordered UUIDv7s (`uuid7`).
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlbus.schemas.events import TaskPublished


def uuid7() -> str:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits; sorts by creation time."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    return str(uuid.UUID(int=value))


def derived_id(*parts: object) -> str:
    """A stable UUID (version 8) from its inputs.

    A consumer that re-handles a message after a crash must publish an event with the
    same id as the first time, so that downstream dedup (by event_id) collapses the two.
    """
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=16).digest()
    value = int.from_bytes(digest, "big")
    value = (value & ~(0xF << 76)) | (0x8 << 76)
    value = (value & ~(0b11 << 62)) | (0b10 << 62)
    return str(uuid.UUID(int=value))


def step_id(run_id: str, kind: str, step: int, incarnation: str = "") -> str:
    """The id of what a role makes once per step. A role that resumed a run names its
    incarnation (`incarnation`; "" for the one that started it): a step it makes again, from
    other samples or with other timings, is another attempt, never the first one's id with
    another content (the broker of a full stop took the first with it)."""
    return derived_id(run_id, kind, step, *((incarnation,) if incarnation else ()))


def group_id_of(task: TaskPublished) -> str:
    """The group of rollouts a task becomes: env producers, judges and the orchestrator all
    name it from the task event alone."""
    return derived_id("group", task.event_id)


def task_event_id(run_id: str, env: str, task_id: str) -> str:
    """A task's natural key: the same task of the same environment in the same run is one event,
    however often it is sent."""
    return derived_id("task", run_id, env, task_id)


def record_id(*where: object, timestamp: int, raw: bytes) -> str:
    """An id for a message known only by where it sat (a dead letter): its position, plus its
    broker timestamp and a digest of its bytes, so a memory-only broker that restarts its
    offsets at 0 never gives two different messages one id."""
    digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
    return derived_id(*where, timestamp, digest)
