"""Waiting for a condition with a deadline, once for every readiness check (a broker that
listens, a store that is served, a server that started, rows that landed). `check` runs
before each try and raises to fail early, e.g. when a process the wait depends on died."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    check: Callable[[], None] | None = None,
) -> None:
    """Poll `predicate()` until true, or raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


async def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    check: Callable[[], None] | None = None,
) -> None:
    """`wait_for` without blocking the event loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(interval_s)


async def every(
    seconds: float, stop: asyncio.Event, action: Callable[[], object], last: bool = False
) -> None:
    """Run the blocking `action` off the event loop every `seconds` until `stop` is set, and
    (`last`) once more then."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), seconds)
        except TimeoutError:
            await asyncio.to_thread(action)
    if last:
        await asyncio.to_thread(action)
