"""A real bus whose broker does not take the first publishes (a request that timed out before it
reached the broker: aiokafka's RequestTimedOutError), and what reached the real broker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka.errors import KafkaError, RequestTimedOutError

from rlbus.bus import Bus, Delivery
from rlbus.bus.topic_reader import read_back
from rlbus.schemas import Event


class RefusingBus:
    """The real bus, but its broker takes the first `after` publishes, then refuses `refusals`."""

    def __init__(self, bus: Bus, refusals: int, after: int = 0) -> None:
        self.bus = bus
        self.refusals = refusals
        self.after = after

    async def publish(self, event: Event) -> None:
        await self.publish_many([event])

    async def publish_many(self, events: Sequence[Event], parents=None) -> None:
        if self.after:
            self.after -= 1
        elif self.refusals:
            self.refusals -= 1
            raise RequestTimedOutError()
        await self.bus.publish_many(events, parents)

    def __getattr__(self, name: str):
        return getattr(self.bus, name)


async def handled(handler: Callable[[list[Delivery]], Awaitable[Any]], deliveries: list[Delivery]):
    """As the subscriber runs a handler: again after a broker error, with the same deliveries."""
    for _ in range(5):
        try:
            return await handler(deliveries)
        except KafkaError:
            continue
    raise AssertionError("the handler kept failing on broker errors")


async def published(bus: Bus, topic: str, run: str, at_least: int) -> list[Event]:
    """The events of `run` on `topic`, once `at_least` are there (or after 10 s)."""
    events: list[Event] = []
    for _ in range(40):  # a new topic's end offsets can lag its first records
        events = await read_back(bus, topic, run)
        if len(events) >= at_least:
            break
        await asyncio.sleep(0.25)
    return events
