"""The sink role's entry (`rlbus worker sink`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rlbus.bus.store import open_store
from rlbus.config import Settings
from rlbus.consumers.sink.sink import Sink, run_sink


async def run(settings: Settings, stop: asyncio.Event, on_serve: Callable[[str], None]) -> Sink:
    """The role's entry (`rlbus worker sink`): hold the store (migrated, with its dedup window),
    serve read-only SQL to other processes on loopback while holding a chdb store (the
    endpoint's URL goes to `on_serve`), and consume every topic into it until `stop`."""
    with open_store(settings.store.url, dedup_window=settings.store.dedup_window) as store:
        if settings.store.serve_http and store.data_dir is not None:
            on_serve(store.serve(settings.store.http_host).url)
        return await run_sink(settings, store, stop)
