"""Python's cycle collector kept off an event-processing hot path.

A poll's events are each a few container objects that live until the poll is handled and are
then freed by reference counting: the collector finds no garbage among them, yet at its default
thresholds it walks them every 700 allocations, and walks the whole heap (every import) every
few polls. Inside `steady_collector()` what existed on entry is frozen out of collections (it
lives as long as the process: imports, config, a model) and the youngest generation is
collected ten times less often; leaving undoes both, so a library caller's process is as it was.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNGEST_THRESHOLD = 7_000
"""Allocations between collections of the youngest generation (CPython's default: 700)."""


@contextmanager
def steady_collector() -> Iterator[None]:
    """Freeze the heap as it is and collect the youngest generation less often, until exit."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(before[0], YOUNGEST_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
