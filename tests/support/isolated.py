"""Settings that keep a test to itself on the shared session broker (a fresh topic prefix, its
own store and claim folder), and a sink process storing into that store."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from rlbus.bus import EmbeddedBroker
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings, load_settings
from rlbus.discovery import store_served_elsewhere
from rlbus.launch.processes import RoleProcess, alive


def isolated_settings(
    broker: EmbeddedBroker, root: Path, *, flush_interval_s: float = 0.2, run_id: str = ""
) -> Settings:
    overrides = {
        "kafka": {
            "bootstrap_servers": broker.bootstrap_servers,
            "topic_prefix": f"t{uuid.uuid4().hex[:8]}.",
            "partitions": 2,
        },
        "store": {"url": f"chdb://{root / 'store'}", "flush_interval_s": flush_interval_s},
        "claim_check": {"url": str(root / "claims")},
    }
    return load_settings(overrides={**overrides, **({"run_id": run_id} if run_id else {})})


@contextlib.contextmanager
def running_sink(settings: Settings, logs: Path) -> Iterator[RoleProcess]:
    """`rlbus worker sink` for `settings`, once it serves its store; stopped on leaving."""
    sink = RoleProcess("sink", settings, logs)
    try:
        wait_for(lambda: store_served_elsewhere(settings), 60, "the sink", check=alive(sink))
        yield sink
    finally:
        sink.stop()


def module_settings(broker: EmbeddedBroker, tmp: Path) -> Settings:
    """What conftest's `settings` gives a test, for a module's shared store."""
    return isolated_settings(broker, tmp, run_id=f"run-{uuid.uuid4().hex[:8]}")
