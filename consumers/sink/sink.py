"""The sink: every topic into its ClickHouse table, batched, idempotent.

Offsets are committed only after the rows are stored. A crash replays the uncommitted tail: a
re-sent block is dropped by its `insert_deduplication_token` (a digest of the messages it
came from), and any other true duplicate collapses under FINAL (the tables are
ReplacingMergeTree ordered by immutable ids, then the content digest). An event that cannot be
stored (a value its column cannot hold) is dead-lettered alone; its neighbours are stored. An
id stored with two different contents is kept twice, listed by the `conflicts` view and logged
here once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from itertools import groupby, repeat
from operator import attrgetter, is_, itemgetter

import numpy as np
import pyarrow as pa

from rlbus.bus import Bus, Delivery
from rlbus.bus.heap import heap_returned
from rlbus.bus.store import Store
from rlbus.bus.store.arrow import events_to_arrow
from rlbus.bus.store.client import block_token
from rlbus.bus.waiting import every
from rlbus.config import Settings
from rlbus.schemas import EVENT_TYPES, TOPICS, Event, codec

log = logging.getLogger(__name__)

GROUP = "sink"


_EVENT, _PARTITION, _OFFSET = attrgetter("event"), attrgetter("partition"), attrgetter("offset")
_RECORD, _VALUE = attrgetter("record"), attrgetter("value")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def by_kind(deliveries: list[Delivery]) -> dict[type[Event], list[Delivery]]:
    """A poll's deliveries by event kind, in order. A poll comes in runs of one topic, so this
    is a step per run, not per row."""
    kinds = map(type, map(_EVENT, deliveries))
    out: dict[type[Event], list[Delivery]] = {}
    for kind, run in groupby(zip(kinds, deliveries, strict=True), key=_FIRST):
        out.setdefault(kind, []).extend(map(_SECOND, run))
    return out


def messages_of(deliveries: list[Delivery]) -> list[bytes]:
    """The distinct messages behind deliveries, as their bytes, in order (a batched topic's
    message carries several events, and is hashed once). Deliveries made without records
    (tests, benches) stand for their events' encodings."""
    records = list(map(_RECORD, deliveries))
    if any(map(is_, records, repeat(None))):
        return list(map(codec.encode, map(_EVENT, deliveries)))
    return list(map(_VALUE, dict(zip(map(id, records), records, strict=True)).values()))


def _block(deliveries: list[Delivery]) -> pa.Table:
    n = len(deliveries)
    return events_to_arrow(
        list(map(_EVENT, deliveries)),
        np.fromiter(map(_PARTITION, deliveries), np.uint32, n),
        np.fromiter(map(_OFFSET, deliveries), np.uint64, n),
    )


def storable(deliveries: list[Delivery]) -> tuple[pa.Table, list[Delivery]]:
    """The Arrow block of deliveries of one kind, and the deliveries in it: one whose event
    cannot be converted to its columns is rejected (dead-lettered) with the reason, alone."""
    try:
        return _block(deliveries), deliveries
    except Exception:  # find which event it was, one at a time
        pass
    good = []
    for d in deliveries:
        try:
            _block([d])
        except Exception as exc:
            d.reject(f"sink: cannot store {type(d.event).__name__} {d.event.event_id}: {exc}")
        else:
            good.append(d)
    return (_block(good) if good else pa.table({})), good


RECENT_IDS = "SELECT event_id FROM {table} WHERE ingested_at >= {{since:DateTime64(6)}}"
"""Ids stored since a time: the minmax index on ingested_at (migration 0010) skips older parts."""
CONFLICTS = (
    "SELECT event_id, groupUniqArray((digest, kafka_partition, kafka_offset)) FROM {table} "
    f"WHERE event_id IN ({RECENT_IDS}) GROUP BY event_id HAVING uniqExact(digest) > 1"
)


class Conflicts:
    """Ids stored with two different contents, logged once each with every origin. Only ids
    among the rows stored since the previous look are searched (with a margin for clocks)."""

    MARGIN_S = 30.0

    def __init__(self, store: Store, every_s: float):
        self.store = store
        self.every_s = every_s
        self.logged: set[tuple[str, str]] = set()
        self.looked = time.time()

    async def watch(self, stop: asyncio.Event) -> None:
        """Look every `every_s` until `stop`, and once more then."""
        await every(self.every_s, stop, self.look, last=True)

    def look(self) -> int:
        """Log the conflicts not logged yet; returns how many there were."""
        since, self.looked = self.looked - self.MARGIN_S, time.time()
        found = 0
        for kind in EVENT_TYPES:
            sql = CONFLICTS.format(table=kind.table)
            for event_id, origins in self.store.query(sql, {"since": since}).rows:
                if (kind.table, event_id) in self.logged:
                    continue
                self.logged.add((kind.table, event_id))
                found += 1
                where = "; ".join(
                    f"digest {d:016x} from partition {p} offset {o}" for d, p, o in sorted(origins)
                )
                log.warning(
                    "conflict: %s event %s is stored with %d different contents (%s); both are "
                    "kept, see the conflicts view",
                    kind.table,
                    event_id,
                    len({d for d, _, _ in origins}),
                    where,
                )
        return found


class Sink:
    def __init__(self, store: Store, conflict_check_s: float = 5.0):
        self.store = store
        self.rows_written = 0
        self.rejected = 0
        self.conflicts = Conflicts(store, conflict_check_s)

    def _insert(self, blocks: list[tuple[type[Event], pa.Table, str]]) -> int:
        return sum(self.store.insert_block(kind, block, token) for kind, block, token in blocks)

    async def handle(self, deliveries: list[Delivery]) -> None:
        """One Arrow block per table per poll."""
        blocks = []
        for kind, group in by_kind(deliveries).items():
            # Built here, not in the insert's thread, which is the slower side of the pipeline
            # (the next poll is decoded here while this one is inserted).
            block, good = storable(group)
            self.rejected += len(group) - len(good)
            if good:
                # The messages' own bytes: a replayed block is dropped, whatever offsets it
                # came from.
                blocks.append((kind, block, block_token(kind, messages_of(good))))
        # chdb is synchronous; a thread keeps the event loop (and Kafka heartbeats) alive.
        self.rows_written += await asyncio.to_thread(self._insert, blocks)


async def run_sink(
    settings: Settings, store: Store, stop: asyncio.Event, topics: list[str] | None = None
) -> Sink:
    """Consume `topics` (default: all) into `store` until `stop` is set."""
    sink = Sink(store, settings.store.conflict_check_s)
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
        consumed = asyncio.Event()
        watching = asyncio.create_task(sink.conflicts.watch(consumed))
        try:
            async with heap_returned():
                await consume.run(stop)
        except BaseException:
            watching.cancel()
            raise
        consumed.set()
        await watching  # one last look at what the final batches stored
    return sink
