"""Following the inference replicas of a run: every WeightLoaded of the run on `weights`, each
with when the broker took it, read outside any consumer group from the topic's start.

A worker re-publishes its WeightLoaded while it serves (consumers.heartbeat), under the same
event id: consumer groups' members drop such repeats (bus.middleware), but here each repeat is
news, the sign that the worker is still there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlbus.bus.records import from_record
from rlbus.bus.topic_reader import from_start
from rlbus.schemas import WeightLoaded

if TYPE_CHECKING:
    from rlbus.bus.bus import Bus

TOPIC = "weights"


async def follow_announcements(
    bus: Bus,
    run_id: str,
    heard: Callable[[WeightLoaded, float], None],
    stop: asyncio.Event,
    poll_ms: int = 500,
) -> None:
    """Call `heard(event, unix_seconds)` for each WeightLoaded of `run_id`, past ones first,
    until `stop`. Records that do not decode are the consumer groups' to dead-letter."""
    async with from_start(bus, TOPIC) as (consumer, _):
        while not stop.is_set():
            polled = await consumer.getmany(timeout_ms=poll_ms)
            for records in polled.values():
                for record in records:
                    try:
                        event = from_record(TOPIC, record, bus.claims)
                    except Exception:  # not ours to judge here
                        continue
                    if isinstance(event, WeightLoaded) and event.run_id == run_id:
                        heard(event, record.timestamp / 1000)
