"""CREATE TABLE statements generated from the event Structs.

`python -m rlbus.bus.store.ddl > bus/store/migrations/0001_events.sql` wrote the first
migration. Later schema changes go into new numbered migrations (ALTER TABLE ... ADD COLUMN);
tests/store/test_store_schema.py fails until the migrated tables match the Structs again.
"""

from __future__ import annotations

from rlbus.bus.store.columns import columns_of, extra_columns, sorting_key
from rlbus.bus.store.sqltext import quote
from rlbus.config.settings import DEFAULT_DEDUP_WINDOW
from rlbus.schemas.events import EVENT_TYPES, Event

SERIAL_PART_REMOVAL = 1_000_000_000
"""concurrent_part_removal_threshold: old parts are removed on one thread, never on a burst of
the engine's pooled threads (migration 0012 says why)."""


def id_columns(kind: type[Event]) -> list[str]:
    """Columns worth a bloom-filter index: ids looked up by equality. The leading ORDER BY
    column is left out because the primary index already finds it."""
    return [
        c.name
        for c in columns_of(kind)
        if (c.name == "event_id" or c.name.endswith("_id")) and c.name != kind.order_by[0]
    ]


def create_table(kind: type[Event]) -> str:
    lines = [f"    {quote(c.name)} {c.ch_type}" for c in columns_of(kind)]
    lines += [f"    {quote(c.name)} {c.spec}" for c in extra_columns(kind)]
    lines += [
        f"    INDEX {quote('idx_' + name)} {quote(name)} TYPE bloom_filter(0.01) GRANULARITY 4"
        for name in id_columns(kind)
    ]
    body = ",\n".join(lines)
    # No version column: duplicates of an event are the same event, so any survivor will do.
    return (
        f"CREATE TABLE IF NOT EXISTS {quote(kind.table)}\n(\n{body}\n)\n"
        "ENGINE = ReplacingMergeTree\n"
        f"ORDER BY ({', '.join(quote(name) for name in sorting_key(kind))})\n"
        f"SETTINGS non_replicated_deduplication_window = {DEFAULT_DEDUP_WINDOW}, "
        f"concurrent_part_removal_threshold = {SERIAL_PART_REMOVAL}"
    )


def events_migration() -> str:
    header = (
        "-- One table per event kind, generated from schemas/events.py by\n"
        "-- `python -m rlbus.bus.store.ddl`. Never edit an applied migration: add a new one.\n"
    )
    return header + "".join(f"\n{create_table(kind)};\n" for kind in EVENT_TYPES)


if __name__ == "__main__":
    print(events_migration(), end="")
