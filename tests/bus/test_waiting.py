"""`unless_stopped`: blocking work (a model's load) runs off the event loop, so a stop set while
it blocks is acted on at once; its result or error comes back when it ends first."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rlbus.bus.waiting import unless_stopped


async def test_a_stop_while_the_work_blocks_returns_at_once() -> None:
    release = threading.Event()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, stop.set)  # the loop turns while the work blocks its thread
    started = time.monotonic()
    assert await unless_stopped(lambda: release.wait(60), stop, "loading") is None
    assert time.monotonic() - started < 2
    release.set()


async def test_the_work_s_result_or_error_comes_back() -> None:
    stop = asyncio.Event()
    assert await unless_stopped(lambda: 42, stop, "loading") == 42

    def refuse() -> None:
        raise RuntimeError("would not fit")

    with pytest.raises(RuntimeError, match="would not fit"):
        await unless_stopped(refuse, stop, "loading")
