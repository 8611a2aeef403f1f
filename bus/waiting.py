"""Waiting for a condition with a deadline, once for every readiness check (a broker that
listens, a store that is served, a server that started, rows that landed). `check` runs
before each try and raises to fail early, e.g. when a process the wait depends on died."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _pauses(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    interval_s: float,
    check: Callable[[], None] | None,
) -> Iterator[float]:
    """The pauses of one wait, the same for a thread and the event loop: one before each try
    after the first, until `predicate()` holds; TimeoutError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        yield interval_s


def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    check: Callable[[], None] | None = None,
) -> None:
    """Poll `predicate()` until true, or raise TimeoutError naming `what`."""
    for pause in _pauses(predicate, timeout_s, what, interval_s, check):
        time.sleep(pause)


async def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    check: Callable[[], None] | None = None,
) -> None:
    """`wait_for` without blocking the event loop."""
    for pause in _pauses(predicate, timeout_s, what, interval_s, check):
        await asyncio.sleep(pause)


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


async def unless_stopped(work: Callable[[], T], stop: asyncio.Event, what: str) -> T | None:
    """Run the blocking `work` (loading a model: minutes for a large one) on a thread of its own
    and return what it returns, or None as soon as `stop` is set first. Run on the event loop,
    such work would hold back the signal handler that sets `stop` until it is done; here the
    role leaves at once, and the thread (a daemon) is left to end with the process: what it
    loads is neither used nor committed anywhere. `what` names it in the thread's name."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def target() -> None:
        try:
            result, error = work(), None
        except BaseException as exc:  # handed to the awaiting coroutine, which raises it
            result, error = None, exc

        def settle() -> None:
            if done.done():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)  # pyright: ignore[reportArgumentType]

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: nobody waits for it any more
            pass

    threading.Thread(target=target, name=f"rlbus-{what}", daemon=True).start()
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({done, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    return done.result() if done.done() else None
