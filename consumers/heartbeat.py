"""Re-announcing a role's current state: the trainer's WeightVersion, an inference worker's
WeightLoaded. A consumer that restarted past the original (the orchestrator) learns where the
run stands from the next repeat; it is the same event (same id) each time, so stores and
running consumers drop the repeats."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka.errors import KafkaError

from rlbus.bus import Bus
from rlbus.schemas import Event

log = logging.getLogger(__name__)


async def keep_announcing(
    bus: Bus, latest: Callable[[], Event | None], every_s: float, stop: asyncio.Event
) -> None:
    """Re-publish `latest()` every `every_s` seconds until `stop`. A beat the broker did not take
    is only missed: the next one says the same."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            event = latest()
            if event is not None:
                try:
                    await bus.publish(event)
                except KafkaError as exc:
                    log.warning(
                        "the broker did not take a repeat of %s (%r)", type(event).__name__, exc
                    )
