"""Which process holds a chdb data directory, and where it serves read-only queries.

The engine flocks `<dir>/status` and writes its PID there. chdb reports a second process's
failure to take that lock only as "Error initializing EmbeddedServer", so the store probes the
lock itself first to be able to say what is going on.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from typing import NamedTuple

HOLDER_READ_SETTINGS = {"use_query_condition_cache": 0}
"""Settings of every read made in the process that holds a chdb store (its own and its
endpoint's). chdb's query condition cache keeps an entry per part for each filter it evaluates,
constants included, and counts it at a third of its size against a 100 MiB limit: reads whose
constants change grew a long-lived holder's engine by ~1 KB each, towards ~300 MB, before it
evicted anything (tests/store/test_store_schema.py)."""

ENDPOINT_FILE = ".rlbus-endpoint"
"""Written into the data directory by the holder's endpoint, readable by its owner only: the
URL it serves on, the PID that serves it and the token it requires."""


class AnnouncedEndpoint(NamedTuple):
    url: str
    token: str
    """The endpoint's password (clickhouse-connect sends it as the password)."""


def holder_pid(data_dir: Path) -> int | None:
    """PID of the process holding the engine lock on `data_dir` (possibly this one), or None."""
    status = data_dir / "status"
    try:
        fd = os.open(status, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            match = re.search(rb"PID: (\d+)", os.pread(fd, 256, 0))
            # A holder that has not written its PID yet is still a holder.
            return int(match.group(1)) if match else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def endpoint_file(data_dir: Path) -> Path:
    return data_dir / ENDPOINT_FILE


def write_endpoint(data_dir: Path, url: str, token: str) -> None:
    """Announce this process's endpoint: the URL, the PID that serves it, and its token, in a
    file only this user can read (created so, never readable by others for a moment)."""
    target = endpoint_file(data_dir)
    staging = target.with_name(f"{target.name}.{os.getpid()}")
    staging.unlink(missing_ok=True)
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{url}\n{os.getpid()}\n{token}\n")
    staging.replace(target)


def withdraw_endpoint(data_dir: Path, url: str) -> None:
    """Remove the announcement of `url`, unless another holder has announced its own since."""
    announced = read_endpoint(data_dir)
    if announced is not None and announced.url == url:
        endpoint_file(data_dir).unlink(missing_ok=True)


def read_endpoint(data_dir: Path) -> AnnouncedEndpoint | None:
    """The announced endpoint, unless the process that announced it is gone (a holder
    killed without withdrawing it, whose successor has not announced its own yet)."""
    try:
        url, pid, token, *_ = [*endpoint_file(data_dir).read_text().split("\n"), "", ""]
    except FileNotFoundError:
        return None
    pid = pid.strip()
    if pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, owned by someone else
    return AnnouncedEndpoint(url.strip(), token.strip()) if url.strip() else None
