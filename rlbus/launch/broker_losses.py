"""What a dead embedded broker took with it: for each topic, the messages it had acknowledged
(bus.ledger, written by every process of the run as it stopped) past the last one the sink
stored (the store's kafka_partition/kafka_offset columns, and the dead letters' origins)."""

from __future__ import annotations

from pathlib import Path

from rlbus.bus.ledger import read_ledgers
from rlbus.bus.store import Store
from rlbus.bus.store.reads.broker_losses import DEAD_END, STORED_END
from rlbus.schemas import TOPICS


def unstored(store: Store, ledgers: Path, prefix: str, since: float) -> dict[str, int]:
    """Messages per topic (unprefixed) that the broker acknowledged and the store does not hold,
    counting only what was stored since `since` (when this broker started)."""
    acked = read_ledgers(ledgers)
    lost: dict[str, int] = {}
    for topic in TOPICS:
        stored: dict[int, int] = {}
        queries: list[tuple[str, dict[str, object]]] = [
            (STORED_END.format(table=kind.table), {"since": since}) for kind in topic.kinds
        ]
        queries.append((DEAD_END, {"topic": topic.name, "since": since}))
        for sql, params in queries:
            for partition, offset in store.query(sql, params).rows:
                stored[int(partition)] = max(stored.get(int(partition), -1), int(offset))
        missing = sum(
            max(0, offset - stored.get(partition, -1))
            for (name, partition), offset in acked.items()
            if name == prefix + topic.name
        )
        if missing:
            lost[topic.name] = missing
    return lost
