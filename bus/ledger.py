"""What the broker acknowledged to the processes of a local run: each process writes, when its
bus stops, the highest acknowledged offset per topic and partition. An embedded broker keeps its
topics in memory, so when it dies, everything past what the sink stored is gone; these files
and the store's kafka_offset columns count it exactly."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path


def write_ledger(directory: Path, acked: Mapping[tuple[str, int], int]) -> None:
    """This process's acknowledgements: `{topic: {partition: highest offset}}`, in a file of
    its own (written whole, then renamed)."""
    directory.mkdir(parents=True, exist_ok=True)
    table: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in acked.items():
        table.setdefault(topic, {})[str(partition)] = offset
    target = directory / f"{os.getpid()}.json"
    staging = directory / f".{os.getpid()}.json"
    staging.write_text(json.dumps(table))
    staging.replace(target)


def read_ledgers(directory: Path) -> dict[tuple[str, int], int]:
    """The highest offset acknowledged per (topic, partition), over every process's file."""
    highest: dict[tuple[str, int], int] = {}
    for path in directory.glob("[0-9]*.json"):
        for topic, partitions in json.loads(path.read_text()).items():
            for partition, offset in partitions.items():
                key = (topic, int(partition))
                highest[key] = max(highest.get(key, -1), offset)
    return highest
