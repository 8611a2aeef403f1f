"""Handing the heap that a role's work freed back to the system.

glibc keeps freed memory in its arenas rather than return it. The sink's polls (up to
`store.batch_rows` events, each a few small allocations made and freed together, among
allocations that live on) left its RSS growing with the largest polls it had seen while the
engine's own memory stayed flat (tests/store/test_sink_heap.py); a trainer's steps (tensors of
every batch's shape, from the threads steps run on) left over a GB of free heap held on the tiny
model (tests/trainer/test_trainer_heap.py), the built-in engine's batches 64-122 MB
(tests/inference/test_engine_heap.py). Figures in docs/benchmarks.md. `malloc_trim`
returns every free page: the roles that consume polls of many small events (sink, orchestrator,
env producer, judge) every few seconds while they run (`heap_returned`), the trainer after each
step, the built-in inference engine when it goes idle and every few seconds while busy; Arrow's
pool is asked to release its unused memory too. The orchestrator alone, fed a soak's events in
one process for 1,000 steps, held 8 MB more anonymous memory at the end, its glibc arena
28 -> 38 MB; with the release 2 MB (docs/benchmarks.md). Other C libraries (musl, macOS) have no
malloc_trim: nothing is done there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import sys
from collections.abc import AsyncIterator, Callable

from rlbus.bus.waiting import every

log = logging.getLogger(__name__)

RELEASE_EVERY_S = 5.0
"""How often a busy role returns freed heap: the sink, at most a poll or two of memory held
between; the engine, a few seconds of batches."""


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None


_TRIM = _malloc_trim()
CAN_RELEASE = _TRIM is not None


def release_free_heap() -> bool:
    """Return the C heap's free pages to the system (and Arrow's, in a process that uses
    Arrow); False where the C library cannot."""
    if _TRIM is None:
        return False
    arrow = sys.modules.get("pyarrow")
    if arrow is not None:
        arrow.default_memory_pool().release_unused()
    _TRIM(0)
    return True


async def release_every(seconds: float, stop: asyncio.Event) -> None:
    """`release_free_heap` every `seconds` (off the event loop) until `stop` is set."""
    if _TRIM is None:
        log.info("this C library has no malloc_trim: freed heap stays with the process")
        return
    await every(seconds, stop, release_free_heap)


@contextlib.asynccontextmanager
async def heap_returned() -> AsyncIterator[None]:
    """While inside, `release_free_heap` every RELEASE_EVERY_S (a role's whole run)."""
    stop = asyncio.Event()
    releasing = asyncio.create_task(release_every(RELEASE_EVERY_S, stop))
    try:
        yield
    finally:
        stop.set()  # a release under way (a few ms) finishes; none starts after
        await releasing
