"""The sink role (`rlbus worker sink`): every topic into the ClickHouse store."""

from __future__ import annotations

import asyncio
import logging

from rlbus.bus.role import RoleSummary
from rlbus.bus.store import Store, StoreLockedError, open_store
from rlbus.config import Settings
from rlbus.consumers.sink.sink import GROUP, Sink, run_sink
from rlbus.schemas import TOPICS

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


class SinkRole:
    """Holds the store (migrated, with its dedup window), serves read-only SQL to other
    processes on loopback while it holds a chdb store, and consumes every topic into it. Waits
    as a standby while another sink holds a chdb store. Given a `store` already open (the
    in-process runner reads from the one it holds), it writes into that one and serves none."""

    name = "sink"
    reads = tuple(t.name for t in TOPICS)
    writes = ()

    def __init__(self, settings: Settings, store: Store | None = None):
        self.settings = settings
        self.store = store
        self.sink: Sink | None = None

    def groups(self) -> list[str]:
        return [GROUP]

    def describe(self) -> str:
        return f"sink: {self.settings.kafka.bootstrap_servers} -> {self.settings.store.url}"

    async def run(self, stop: asyncio.Event) -> RoleSummary:
        if self.store is not None:
            self.sink = await run_sink(self.settings, self.store, stop)
        elif (store := await held_store(self.settings, stop)) is not None:
            with store:
                if self.settings.store.serve_http and store.data_dir is not None:
                    url = store.serve(self.settings.store.http_host).url
                    log.info("read-only SQL endpoint: %s", url)
                self.sink = await run_sink(self.settings, store, stop)
        rows = self.sink.rows_written if self.sink is not None else 0
        return RoleSummary(
            self.name, f"sink stopped after writing {rows:,} rows", figures={"rows": rows}
        )
