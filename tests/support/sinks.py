"""The sink as its own process, and publishing to it, for the store's tests and the ui's."""

from __future__ import annotations

from pathlib import Path

from rlbus.bus import Bus
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings
from rlbus.discovery import store_served_elsewhere
from rlbus.launch.processes import RoleProcess, alive
from rlbus.schemas import Event


def start_sink(settings: Settings, log_dir: Path) -> RoleProcess:
    sink = RoleProcess("sink", settings, log_dir)
    wait_for(
        lambda: store_served_elsewhere(settings),
        60,
        "the sink to serve the store",
        check=alive(sink),
    )
    return sink


async def publish(settings: Settings, events: list[Event], chunk: int = 5000) -> None:
    async with Bus.of(settings) as bus:
        for start in range(0, len(events), chunk):
            await bus.publish_many(events[start : start + chunk])
