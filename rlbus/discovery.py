"""Finding the local broker and store: how commands find an embedded broker another command
started, and whether another process holds the chdb store.

`rlbus broker`, `rlbus quickstart` and `rlbus run` write the embedded broker's address to
`<data dir>/.rlbus-broker`; commands with no `kafka.bootstrap_servers` configured use it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import TypeVar

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store.holder import holder_pid, read_endpoint
from rlbus.config import Settings, data_dir

S = TypeVar("S", bound=Settings)

BROKER_FILE = ".rlbus-broker"


def store_served_elsewhere(settings: Settings) -> bool:
    """Another process holds the chdb store and has announced its read-only endpoint.

    Until then this process must not open the directory itself: chdb admits one process
    per directory, and opening it would lock out the process meant to hold it.
    """
    directory = data_dir(settings).resolve()
    pid = holder_pid(directory)
    return pid is not None and pid != os.getpid() and read_endpoint(directory) is not None


def _reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except (OSError, ValueError):
        return False


def discover_bootstrap(settings: Settings) -> str | None:
    """The configured bootstrap servers, else a live embedded broker's address from its file."""
    if settings.kafka.bootstrap_servers:
        return settings.kafka.bootstrap_servers
    path = data_dir(settings) / BROKER_FILE
    if path.exists():
        address = path.read_text().strip()
        if _reachable(address):
            return address
    return None


def require_bootstrap(settings: S) -> S:
    """Settings with bootstrap servers filled in, or a message saying how to get a broker."""
    address = discover_bootstrap(settings)
    if address is None:
        raise SystemExit(
            "no Kafka broker: pass --kafka.bootstrap-servers HOST:PORT (or set "
            "RLBUS_KAFKA__BOOTSTRAP_SERVERS), or start one with `rlbus broker`"
        )
    return settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"bootstrap_servers": address})}
    )


@contextlib.contextmanager
def local_broker(settings: Settings) -> Iterator[Settings]:
    """Use the configured broker, or start an embedded one for the duration and advertise it."""
    if settings.kafka.bootstrap_servers:
        yield settings
        return
    directory = data_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker(log_path=directory / "broker.log") as broker:
        path = directory / BROKER_FILE
        path.write_text(broker.bootstrap_servers)
        try:
            yield settings.model_copy(
                update={
                    "kafka": settings.kafka.model_copy(
                        update={"bootstrap_servers": broker.bootstrap_servers}
                    )
                }
            )
        finally:
            with contextlib.suppress(FileNotFoundError):
                if path.read_text() == broker.bootstrap_servers:
                    os.unlink(path)
