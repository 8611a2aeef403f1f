"""Publishing a stream of tasks onto the `tasks` topic, in acknowledged chunks."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice

from rlbus.bus import Bus
from rlbus.config import Settings
from rlbus.schemas import TaskPublished

CHUNK = 1000


async def publish_tasks(
    settings: Settings,
    tasks: Iterable[TaskPublished],
    on_chunk: Callable[[int], None] | None = None,
) -> int:
    """Publish tasks in chunks (each acknowledged by the broker before the next); `on_chunk`
    sees each chunk's size (a progress bar). Returns the count."""
    count = 0
    async with Bus.of(settings) as bus:
        iterator = iter(tasks)
        while chunk := list(islice(iterator, CHUNK)):
            await bus.publish_many(chunk)
            count += len(chunk)
            if on_chunk is not None:
                on_chunk(len(chunk))
    return count
