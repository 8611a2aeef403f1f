"""Re-announcing a role's state (consumers/heartbeat.py) against a real broker."""

from __future__ import annotations

import asyncio

from support.broker_refusals import RefusingBus, published

from rlbus.bus import Bus
from rlbus.config import Settings
from rlbus.consumers.heartbeat import keep_announcing
from rlbus.schemas import WeightLoaded


async def test_announcing_goes_on_after_a_beat_the_broker_refused(settings: Settings) -> None:
    """Before: the refused beat ended the announcing task, so an inference replica fell silent
    for good and the orchestrator stopped counting it as live."""
    loaded = WeightLoaded(run_id=settings.run_id, worker_id="w", version=1)
    stop = asyncio.Event()
    async with Bus.of(settings) as real:
        bus = RefusingBus(real, refusals=1)
        announcing = asyncio.create_task(
            keep_announcing(bus, lambda: loaded, 0.1, stop)  # type: ignore[arg-type]
        )
        repeats = await published(real, "weights", settings.run_id, 1)
        stop.set()
        await announcing
    assert [e.event_id for e in repeats][:1] == [loaded.event_id]
