"""Handing the heap that a poll's events freed back to the system.

A poll is up to `store.batch_rows` events, each a few small allocations (its message, its
Struct, its bytes fields) made and freed together, among allocations that live on. glibc keeps
such freed memory in its arenas rather than return it, so the sink's RSS grew with the largest
polls it had seen while the engine's own memory stayed flat (bench/soak.py showed it;
tests/store/test_sink_heap.py checks that the sink gives it back; the figures are in
docs/benchmarks.md). `malloc_trim` returns every free page, quickly enough to run between
polls; Arrow's pool is asked to release its unused memory too. Other C libraries (musl, macOS)
have no malloc_trim: nothing is done there.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

import pyarrow as pa

from rlbus.bus.waiting import every

log = logging.getLogger(__name__)

RELEASE_EVERY_S = 5.0
"""How often the sink returns freed heap: at most a poll or two of memory is held between."""


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
    """Return the C heap's free pages to the system; False where the C library cannot."""
    if _TRIM is None:
        return False
    pa.default_memory_pool().release_unused()
    _TRIM(0)
    return True


async def release_every(seconds: float, stop: asyncio.Event) -> None:
    """`release_free_heap` every `seconds` (off the event loop) until `stop` is set."""
    if _TRIM is None:
        log.info("this C library has no malloc_trim: freed heap stays with the process")
        return
    await every(seconds, stop, release_free_heap)
