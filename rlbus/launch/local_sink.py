"""The store served by a sink on this machine, for commands that publish and then read back
what landed (`rlbus quickstart`, `rlbus eval`, `rlbus run`): a sink that already serves the
store is used as it is, otherwise one is started as a child process and stopped on leaving."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rlbus.bus.store import open_store
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings, data_dir
from rlbus.discovery import store_served_elsewhere
from rlbus.launch.processes import RoleProcess, alive


@dataclass
class LocalSink:
    settings: Settings
    process: RoleProcess | None
    """The sink this command started, or None when another process serves the store."""

    def count(self, sql: str, parameters: dict[str, Any]) -> int:
        """The first column of the first row of a read-only query."""
        with open_store(self.settings.store.url, read_only=True) as store:
            return int(store.query(sql, parameters).rows[0][0])

    def wait_landed(
        self,
        sql: str,
        parameters: dict[str, Any],
        expected: int,
        what: str,
        timeout_s: float,
        on_count: Callable[[int], None] | None = None,
    ) -> None:
        """Until `sql` counts at least `expected` rows; `on_count` sees each count (a progress
        bar). Fails early, with its log tail, when the sink this command started dies."""

        def landed() -> bool:
            count = self.count(sql, parameters)
            if on_count is not None:
                on_count(count)
            return count >= expected

        check = alive(self.process) if self.process is not None else None
        wait_for(landed, timeout_s, what, check=check)


@contextlib.contextmanager
def local_sink(settings: Settings, timeout_s: float = 120) -> Iterator[LocalSink]:
    """A sink serving `settings`' store for the duration (`settings` has a broker). A ClickHouse
    server store gets a sink process too (another sink in the same group only shares the
    partitions); a chdb store is waited for until its holder serves it to this process."""
    process = None
    embedded = settings.store.url.startswith("chdb://")
    if not (embedded and store_served_elsewhere(settings)):
        process = RoleProcess("sink", settings, data_dir(settings) / "logs")
    try:
        if process is not None and embedded:
            wait_for(
                lambda: store_served_elsewhere(settings),
                timeout_s,
                "the sink to serve the store",
                check=alive(process),
            )
        yield LocalSink(settings, process)
    finally:
        if process is not None:
            process.stop()
