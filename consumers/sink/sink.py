"""The sink: every topic into its ClickHouse table, batched, idempotent.

Offsets are committed only after the rows are stored. A crash replays the uncommitted
tail: a re-sent block with the same topic-partition-offset range is dropped by
`insert_deduplication_token`, and any other duplicate collapses under FINAL (the tables
are ReplacingMergeTree ordered by immutable ids).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable

from rlbus.bus import Bus, Delivery
from rlbus.bus.store import Store, open_store
from rlbus.config import Settings
from rlbus.schemas import TOPICS

log = logging.getLogger(__name__)

GROUP = "sink"


def dedup_token(table: str, deliveries: list[Delivery]) -> str:
    """`table|topic:partition:first-last|...#digest`: the same replayed block gets the same
    token. The digest of the block's event ids keeps blocks apart whose offsets coincide but
    whose events do not: a fresh embedded broker numbers its offsets from 0 again while the
    store keeps the previous run's blocks."""
    offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
    for d in deliveries:
        offsets[(d.topic, d.partition)].append(d.offset)
    parts = [f"{t}:{p}:{min(o)}-{max(o)}" for (t, p), o in sorted(offsets.items())]
    digest = hashlib.blake2b(
        "".join(d.event.event_id for d in deliveries).encode(), digest_size=8
    ).hexdigest()
    return "|".join([table, *parts]) + "#" + digest


class Sink:
    def __init__(self, store: Store):
        self.store = store
        self.rows_written = 0

    async def handle(self, deliveries: list[Delivery]) -> None:
        by_table: dict[str, list[Delivery]] = defaultdict(list)
        for d in deliveries:
            by_table[type(d.event).table].append(d)
        for table, group in by_table.items():
            # chdb is synchronous; a thread keeps the event loop (and Kafka heartbeats) alive.
            await asyncio.to_thread(
                self.store.insert_events,
                [d.event for d in group],
                [(d.partition, d.offset) for d in group],
                dedup_token(table, group),
            )
            self.rows_written += len(group)


async def run_sink(
    settings: Settings, store: Store, stop: asyncio.Event, topics: list[str] | None = None
) -> Sink:
    """Consume `topics` (default: all) into `store` until `stop` is set."""
    sink = Sink(store)
    async with Bus.of(settings) as bus:
        consume = bus.subscriber(
            *(topics or [t.name for t in TOPICS]),
            group=GROUP,
            batch=True,
            batch_rows=settings.store.batch_rows,
            batch_wait_s=settings.store.flush_interval_s,
            # Dedup happens in ClickHouse; a set of every id ever seen would only cost memory.
            dedup=False,
            # A store that fails is not the events' fault: stop uncommitted, redeliver on restart.
            on_error="stop",
        )(sink.handle)
        await consume.run(stop)
    return sink


async def hold_store(
    settings: Settings, stop: asyncio.Event, on_serve: Callable[[str], None]
) -> Sink:
    """The role's entry (`rlbus worker sink`): hold the store (migrated, with its dedup window),
    serve read-only SQL to other processes on loopback while holding a chdb store (the
    endpoint's URL goes to `on_serve`), and consume every topic into it until `stop`."""
    with open_store(settings.store.url, dedup_window=settings.store.dedup_window) as store:
        if settings.store.serve_http and store.data_dir is not None:
            on_serve(store.serve(settings.store.http_host).url)
        return await run_sink(settings, store, stop)
