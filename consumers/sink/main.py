"""The sink role's entry (`rlbus worker sink`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rlbus.bus.store import Store, StoreLockedError, open_store
from rlbus.config import Settings
from rlbus.consumers.sink.sink import Sink, run_sink

log = logging.getLogger(__name__)

STANDBY_POLL_S = 0.5
"""How often a standby sink tries the chdb store's lock."""


async def held_store(settings: Settings, stop: asyncio.Event) -> Store | None:
    """The store, opened for writing. A chdb store held by another sink (a directory admits one
    process) is waited for as a standby, until its holder is gone; None if `stop` comes first."""
    waiting = False
    while not stop.is_set():
        try:
            return open_store(settings.store.url, dedup_window=settings.store.dedup_window)
        except StoreLockedError as exc:
            if not waiting:
                log.warning("%s; this sink waits as a standby until it is free", exc)
                waiting = True
        try:
            await asyncio.wait_for(stop.wait(), STANDBY_POLL_S)
        except TimeoutError:
            pass
    return None


async def run(
    settings: Settings, stop: asyncio.Event, on_serve: Callable[[str], None]
) -> Sink | None:
    """The role's entry (`rlbus worker sink`): hold the store (migrated, with its dedup window),
    serve read-only SQL to other processes on loopback while holding a chdb store (the
    endpoint's URL goes to `on_serve`), and consume every topic into it until `stop`. Waits as
    a standby while another sink holds a chdb store (None: stopped before it held it)."""
    store = await held_store(settings, stop)
    if store is None:
        return None
    with store:
        if settings.store.serve_http and store.data_dir is not None:
            on_serve(store.serve(settings.store.http_host).url)
        return await run_sink(settings, store, stop)
