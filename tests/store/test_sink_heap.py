"""The sink gives back the heap its polls freed. glibc keeps freed memory in its arenas: after
this test's 60,000 large token records had gone through the real broker into the sink, the
process held 222-232 MB more outside ClickHouse's engine than before them, nearly all of it
free C heap; the sink now returns it every few seconds (bus/heap.py), and 68-93 MB
more remain (pages that still hold a live allocation, and the engine's own growth)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from support.sinks import publish
from support.token_records import token_records

from rlbus.bus.heap import CAN_RELEASE, RELEASE_EVERY_S
from rlbus.bus.store import Store, open_store
from rlbus.bus.waiting import wait_until
from rlbus.config import Settings
from rlbus.consumers.sink.sink import run_sink

pytestmark = pytest.mark.skipif(
    not CAN_RELEASE, reason="this C library has no malloc_trim: the sink keeps what it freed"
)

ROWS, TOKENS = 60_000, 256


def heap_outside_engine_mb(store: Store) -> float:
    """This process's anonymous RSS less what ClickHouse's allocator holds resident."""
    anon_kb = int(re.search(r"RssAnon:\s+(\d+)", Path("/proc/self/status").read_text())[1])
    return anon_kb / 1024 - store.engine_memory_mb()["jemalloc resident"]


def stored(store: Store) -> int:
    return int(store.query("SELECT count() FROM tokens").rows[0][0])


@pytest.mark.slow
def test_the_sink_returns_the_heap_its_polls_freed(settings: Settings, tmp_path: Path) -> None:
    async def scenario(store: Store) -> tuple[float, float]:
        stop = asyncio.Event()
        sinking = asyncio.create_task(run_sink(settings, store, stop))
        try:
            before = heap_outside_engine_mb(store)
            for start in range(0, ROWS, ROWS // 3):
                await publish(settings, token_records(ROWS // 3, TOKENS, settings.run_id, start))
            await wait_until(lambda: stored(store) == ROWS, 120, f"{ROWS} token records")
            # A small poll after the large ones: the subscriber lets go of the last of them.
            await publish(settings, token_records(10, TOKENS, settings.run_id, ROWS))
            await wait_until(lambda: stored(store) == ROWS + 10, 60, "the last poll")
            await asyncio.sleep(2 * RELEASE_EVERY_S)
            return before, heap_outside_engine_mb(store)
        finally:
            stop.set()
            await sinking

    with open_store(f"chdb://{tmp_path / 'store'}") as store:
        before, after = asyncio.run(scenario(store))
    assert after - before < 150, (before, after)
