"""Finding the local broker and store: how commands find an embedded broker another command
started (and reuse it, never starting a second one or touching another's announcement), and
whether another process holds the chdb store.

`rlbus broker`, `rlbus quickstart` and `rlbus run` write the embedded broker's address to
`<data dir>/.rlbus-broker`; commands with no `kafka.bootstrap_servers` configured use it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
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


def reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class Announcement:
    """What `.rlbus-broker` says: a broker's address and the process that owns it."""

    address: str
    pid: int

    def live(self) -> bool:
        return _alive(self.pid) and reachable(self.address)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, someone else's
    return True


def announced_broker(settings: Settings) -> Announcement | None:
    """The live embedded broker announced in the data directory, if any."""
    try:
        address, _, pid = (data_dir(settings) / BROKER_FILE).read_text().strip().partition("\n")
    except FileNotFoundError:
        return None
    found = Announcement(address.strip(), int(pid) if pid.strip().isdigit() else -1)
    return found if found.pid > 0 and found.live() else None


def _announce(path: Path, address: str) -> None:
    staging = path.with_name(f"{path.name}.{os.getpid()}")
    staging.write_text(f"{address}\n{os.getpid()}\n")
    staging.replace(path)


def _withdraw(path: Path, address: str) -> None:
    """Remove our announcement, never another process's."""
    try:
        current = path.read_text().split()
    except FileNotFoundError:
        return
    if current == [address, str(os.getpid())]:
        path.unlink(missing_ok=True)


def announce_moved(settings: Settings, old: str, new: str) -> None:
    """The broker this process announced at `old` now listens at `new` (a handover)."""
    path = data_dir(settings) / BROKER_FILE
    try:
        ours = path.read_text().split() == [old, str(os.getpid())]
    except FileNotFoundError:
        ours = False
    if ours:
        _announce(path, new)


def discover_bootstrap(settings: Settings) -> str | None:
    """The configured bootstrap servers, else a live embedded broker's address from its file."""
    if settings.kafka.bootstrap_servers:
        return settings.kafka.bootstrap_servers
    found = announced_broker(settings)
    return found.address if found else None


def require_bootstrap(settings: S) -> S:
    """Settings with bootstrap servers filled in, or a message saying how to get a broker."""
    address = discover_bootstrap(settings)
    if address is None:
        raise SystemExit(
            "no Kafka broker: pass --kafka.bootstrap-servers HOST:PORT (or set "
            "RLBUS_KAFKA__BOOTSTRAP_SERVERS), or start one with `rlbus broker`"
        )
    return with_bootstrap(settings, address)


def with_bootstrap(settings: S, address: str) -> S:
    return settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"bootstrap_servers": address})}
    )


@contextlib.contextmanager
def local_broker(settings: S) -> Iterator[tuple[S, EmbeddedBroker | None]]:
    """The configured broker; else the embedded broker another command announced in the data
    directory; else one started here for the duration, announced, and withdrawn after. Yields
    the settings with its address and the broker this process started (None if reused)."""
    address = discover_bootstrap(settings)
    if address is not None:
        yield with_bootstrap(settings, address), None
        return
    directory = data_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker(log_path=directory / "broker.log") as broker:
        path = directory / BROKER_FILE
        _announce(path, broker.bootstrap_servers)
        try:
            yield with_bootstrap(settings, broker.bootstrap_servers), broker
        finally:
            _withdraw(path, broker.bootstrap_servers)
