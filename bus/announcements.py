"""Following the inference replicas of a run: every WeightLoaded of the run on `weights`, each
with when the broker took it, read outside any consumer group from the topic's start.

A worker re-publishes its WeightLoaded while it serves (consumers.heartbeat), under the same
event id: consumer groups' members drop such repeats (bus.middleware), but here each repeat is
news, the sign that the worker is still there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiokafka.errors import KafkaError

from rlbus.bus.topic_reader import from_start, run_events
from rlbus.schemas import WeightLoaded

if TYPE_CHECKING:
    from rlbus.bus.bus import Bus

TOPIC = "weights"

log = logging.getLogger(__name__)


async def follow_announcements(
    bus: Bus,
    run_id: str,
    heard: Callable[[WeightLoaded, float], None],
    stop: asyncio.Event,
    poll_ms: int = 500,
    retry_s: float = 1.0,
) -> None:
    """Call `heard(event, unix_seconds)` for each WeightLoaded of `run_id`, past ones first,
    until `stop`. Records that do not decode are the consumer groups' to dead-letter.

    A broker error starts the reading again from the topic's start `retry_s` later: a follower
    that gave up would leave its roster hearing no replica, and the orchestrator waiting for
    ever for a version its replicas serve (`heard` takes repeats)."""
    while not stop.is_set():
        try:
            await _follow(bus, run_id, heard, stop, poll_ms)
        except KafkaError as exc:
            log.warning(
                "following the inference replicas of run %s: %r; again in %gs", run_id, exc, retry_s
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), retry_s)


async def _follow(
    bus: Bus,
    run_id: str,
    heard: Callable[[WeightLoaded, float], None],
    stop: asyncio.Event,
    poll_ms: int,
) -> None:
    async with from_start(bus, TOPIC) as (consumer, partitions):
        if not partitions:  # a broker that lost its topics (the embedded one keeps none)
            raise KafkaError(f"{bus.topics.name(TOPIC)} has no partitions yet")
        while not stop.is_set():
            polled = await consumer.getmany(timeout_ms=poll_ms)
            for records in polled.values():
                for record, event in run_events(bus, TOPIC, records, run_id):
                    if isinstance(event, WeightLoaded):
                        heard(event, record.timestamp / 1000)
