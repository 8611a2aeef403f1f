"""The store: events in, events and query results out, over clickhouse-connect.

`chdb://PATH` runs ClickHouse in this process; `http(s)://[user:pass@]host:port[/database]`
talks to a server. A chdb data directory can be open in one process only, so a read-only open
of a directory held by another process goes through that process's loopback endpoint (with
the token it announced). Every thread gets its own client: chdb sessions must not be shared by
threads that insert.

A read-only store runs only what bus.store.guard passes, decided on the parse of the engine
that runs it (the endpoint decides for queries sent through it), with readonly=2 on a chdb
session and only allowed settings. The URL's password never appears in messages.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import chdb
import clickhouse_connect
import numpy as np
import pyarrow as pa
from clickhouse_connect.driver.client import Client

from rlbus.bus.store.arrow import arrow_to_events, events_to_arrow
from rlbus.bus.store.columns import columns_of
from rlbus.bus.store.endpoint import StoreEndpoint
from rlbus.bus.store.guard import Guard, Refused, check_settings
from rlbus.bus.store.holder import (
    ENDPOINT_FILE,
    HOLDER_READ_SETTINGS,
    AnnouncedEndpoint,
    holder_pid,
    read_endpoint,
)
from rlbus.bus.store.migrate import migrate
from rlbus.bus.store.sqltext import quote, read_only_problem, trailing_format
from rlbus.config.secret import SecretUrl
from rlbus.config.settings import DEFAULT_STORE_URL
from rlbus.schemas import codec
from rlbus.schemas.events import Event

E = TypeVar("E", bound=Event)


class StoreError(RuntimeError):
    """A store that cannot be opened or used as asked; the message says what to do."""


class StoreLockedError(StoreError):
    """The chdb data directory is held by another process."""


@dataclass(frozen=True)
class Rows:
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]


class Store:
    """Use `open_store`. Safe to share between threads: each thread that uses the store gets
    its own client, and all of them close with the store."""

    def __init__(
        self,
        url: str,
        *,
        read_only: bool,
        data_dir: Path | None = None,
        server_url: str | None = None,
        token: str | None = None,
    ):
        self.url = SecretUrl(url)
        """Prints without its password."""
        self.read_only = read_only
        self.data_dir = data_dir
        """The chdb data directory, when this process holds it."""
        self.via = server_url if url.startswith("chdb://") else None
        """The endpoint of the process holding the chdb store, when reading through it."""
        self._server_url = server_url
        self._token = token
        self._guard = Guard()
        self._local = threading.local()
        self._clients: list[Client] = []
        self._chdb_conns: list[Any] = []
        self._lock = threading.Lock()
        self._endpoint: StoreEndpoint | None = None
        self._closed = False

    def _client(self) -> Client:
        client: Client | None = getattr(self._local, "client", None)
        if client is not None:
            return client
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self.url} is closed")
            if self.data_dir is not None:
                client = clickhouse_connect.get_client(
                    interface="chdb",
                    path=str(self.data_dir),
                    settings=HOLDER_READ_SETTINGS | ({"readonly": 2} if self.read_only else {}),
                )
            else:
                client = clickhouse_connect.get_client(**self.client_options())
            self._clients.append(client)
        self._local.client = client
        return client

    def client_options(self) -> dict[str, Any]:
        """clickhouse-connect's get_client arguments for a server store or an endpoint."""
        assert self._server_url is not None
        # The DSN's scheme alone does not pick TLS (only ports 443/8443 do), so say it.
        options: dict[str, Any] = {
            "dsn": str.__str__(self._server_url),
            "interface": urlsplit(self._server_url).scheme,
        }
        if self._token is not None:
            # The endpoint: bound values go in a form body; in the URL, urllib3 percent-checks a
            # page's list of ids character by character in Python (docs/benchmarks.md).
            options |= {
                "username": "rlbus",
                "password": self._token,
                "form_encode_query_params": True,
            }
        return options

    def _statement(
        self, sql: str, parameters: dict[str, Any] | None, settings: dict[str, Any] | None
    ) -> str:
        """The statement to run: on a read-only store, the one the guard passed (through an
        endpoint, the endpoint decides, after the text gate here)."""
        if not self.read_only:
            return sql
        try:
            if self.via is not None:  # the endpoint decides; a plain write is named here at once
                if problem := read_only_problem(sql):
                    raise Refused(problem)
                return sql
            check_settings(settings or {})
            client = self._client()

            def run(query: str, bound: Any) -> list[str]:
                raw = client.raw_query(query, parameters=bound, fmt="TabSeparatedRaw")
                return raw.decode(errors="replace").split("\n")

            return self._guard.statement(sql, parameters, run)
        except Refused as exc:
            raise StoreError(f"store {self.url} is open read-only: {exc}") from None

    def _check_write(self, what: str) -> None:
        if self.read_only:
            raise StoreError(f"cannot {what}: store {self.url} is open read-only")

    def query(
        self,
        sql: str,
        parameters: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> Rows:
        """`settings` are ClickHouse query settings (limits such as max_result_rows)."""
        sql = self._statement(sql, parameters, settings)
        result = self._client().query(sql, parameters=parameters, settings=settings)
        return Rows(tuple(result.column_names), [tuple(row) for row in result.result_rows])

    def query_arrow(self, sql: str, parameters: dict[str, Any] | None = None) -> pa.Table:
        sql = self._statement(sql, parameters, None)
        return self._client().query_arrow(sql, parameters=parameters, use_strings=True)

    def engine_memory_mb(self) -> dict[str, float]:
        """The serving engine's own memory figures, in MB: "tracked" (MemoryTracking) and, from
        its jemalloc (which serves the engine only), "jemalloc allocated" and "jemalloc
        resident"; for chdb, the engine of the process that holds the store."""
        tracked = self.query("SELECT value FROM system.metrics WHERE metric = 'MemoryTracking'")
        stats = str(self.query("SELECT stats FROM system.jemalloc_stats").rows[0][0])
        figures = {"tracked": int(tracked.rows[0][0]) / 2**20}
        if (found := _JEMALLOC.search(stats)) is not None:
            figures["jemalloc allocated"] = int(found[1]) / 2**20
            figures["jemalloc resident"] = int(found[2]) / 2**20
        return figures

    def query_raw(
        self, sql: str, fmt: str = "TabSeparated", parameters: dict[str, Any] | None = None
    ) -> bytes:
        """The result as ClickHouse formats it (`fmt`, unless the SQL ends in its own FORMAT)."""
        sql = self._statement(sql, parameters, None)
        own_format = trailing_format(sql.rstrip().rstrip(";"))
        return self._client().raw_query(sql, parameters=parameters, fmt=None if own_format else fmt)

    def command(self, sql: str) -> Any:
        """Run a statement that changes the store (DDL, OPTIMIZE, ...)."""
        self._check_write(f"run {sql[:60]!r}")
        return self._client().command(sql)

    def migrate(self) -> list[str]:
        """Apply pending migrations; returns the names applied now."""
        self._check_write("migrate")
        return migrate(self._client())

    def set_dedup_window(self, blocks: int) -> None:
        """Remember `blocks` inserted blocks per table for insert_deduplication_token: every
        event table, and the tables ClickHouse fills from them (latest_scores)."""
        self._check_write("change the dedup window")
        current = self.query(
            "SELECT name, extract(engine_full, 'deduplication_window = ([0-9]+)') "
            "FROM system.tables WHERE database = currentDatabase() AND engine LIKE '%MergeTree' "
            "AND name != 'schema_migrations'"
        ).rows
        for table, window in current:
            if window != str(blocks):
                self.command(
                    f"ALTER TABLE {quote(table)} "
                    f"MODIFY SETTING non_replicated_deduplication_window = {blocks}"
                )

    def insert_events(
        self,
        events: Sequence[Event],
        positions: Sequence[tuple[int, int]],
        dedup_token: str | None = None,
    ) -> int:
        """Insert events of one kind with their Kafka (partition, offset) positions, as one
        block (see `insert_block`); the default token covers the events' encodings. Returns the
        number of rows sent."""
        if not events:
            return 0
        kind = type(events[0])
        if dedup_token is None:
            dedup_token = block_token(kind, list(map(codec.encode, events)))
        partitions, offsets = zip(*positions, strict=True)
        return self.insert_block(kind, events_to_arrow(events, partitions, offsets), dedup_token)

    def insert_block(self, kind: type[Event], block: pa.Table, dedup_token: str) -> int:
        """Insert an Arrow block of `kind`'s rows (bus.store.arrow.events_to_arrow); ClickHouse
        computes each row's digest. A block re-sent with the same token (block_token) is
        dropped by ClickHouse."""
        self._check_write("insert events")
        if not block.num_rows:
            return 0
        token = dedup_token
        if self.data_dir is not None:
            self._insert_chdb(kind.table, block, token)
        else:
            settings = {"insert_deduplication_token": token} if token else None
            self._client().insert_arrow(kind.table, block, settings=settings)
        return block.num_rows

    def _insert_chdb(self, name: str, arrow_block: pa.Table, dedup_token: str) -> None:
        """Insert through chdb's Python() table function, which reads the Arrow table in place
        (clickhouse-connect's insert_arrow first writes the block out as an Arrow IPC stream for
        the engine to read back; bench/bus.py's baseline is the same Python() insert). A
        connection per thread, since chdb resolves `arrow_block` by name in the calling frame."""
        conn = getattr(self._local, "chdb", None)
        if conn is None:
            conn = chdb.connect(str(self.data_dir))
            self._local.chdb = conn
            with self._lock:
                self._chdb_conns.append(conn)
        columns = ", ".join(map(quote, arrow_block.column_names))
        token = dedup_token.replace("\\", "\\\\").replace("'", "\\'")
        settings = f" SETTINGS insert_deduplication_token = '{token}'" if dedup_token else ""
        conn.query(
            f"INSERT INTO {quote(name)} ({columns}){settings} SELECT * FROM Python(arrow_block)"
        )

    def read_events(
        self,
        kind: type[E],
        where: str = "",
        final: bool = True,
        parameters: dict[str, Any] | None = None,
    ) -> list[E]:
        """Stored events of `kind` in ORDER BY order; `where` is a SQL condition. `final`: one
        event per id: FINAL collapses the duplicates merges have not removed yet, and an id
        stored with two contents (a computation done twice, e.g. a task rolled out again after
        a crash: the conflicts view) reads as its newest, so the pieces of one rollout come
        from one attempt as long as its last attempt landed whole."""
        select = ", ".join(quote(c.name) for c in columns_of(kind))
        rows = f"SELECT {select} FROM {quote(kind.table)}{' FINAL' if final else ''}" + (
            f" WHERE {where}" if where else ""
        )
        if final:
            rows = f"SELECT * FROM ({rows} ORDER BY ts DESC LIMIT 1 BY event_id)"
        sql = f"{rows} ORDER BY {', '.join(map(quote, kind.order_by))}"
        return arrow_to_events(kind, self.query_arrow(sql, parameters))

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> StoreEndpoint:
        """Serve read-only queries to other processes until the store closes (chdb stores only)."""
        if self.data_dir is None:
            raise StoreError(
                f"only the process holding a chdb store can serve it; {self.url} is not one"
            )
        if self._endpoint is None:
            self._client()  # the engine must be up before the endpoint's connections join it
            self._endpoint = StoreEndpoint(self.data_dir, host, port)
        return self._endpoint

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            clients, self._clients = self._clients, []
            conns, self._chdb_conns = self._chdb_conns, []
        if self._endpoint is not None:
            self._endpoint.close()
        for client in clients:
            client.close()
        for conn in conns:
            conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_JEMALLOC = re.compile(r"Allocated: (\d+), active: \d+, metadata: \d+.*?, resident: (\d+)")
"""The totals line of jemalloc's statistics (malloc_stats_print)."""


def block_token(kind: type[Event], messages: Sequence[bytes]) -> str:
    """The insert dedup token of a block: `table#digest` of the encoded messages its rows came
    from, in order (each message holds its events' ids and contents). A replayed block (the
    same messages) gets the same token, wherever the messages sat; a block with anything new,
    or an event with other content, does not."""
    # Every byte, under a hash no one can aim at: anyone may publish to `tasks`, and a message
    # made to share a weaker checksum with another would have its block dropped as a replay.
    # SHA-256 runs on the CPU's SHA instructions where it has them, so hashing every byte stays
    # cheap (docs/benchmarks.md); one update over the joined messages.
    h = hashlib.sha256(np.fromiter(map(len, messages), np.int64, len(messages)).tobytes())
    h.update(b"".join(messages))
    return f"{kind.table}#{h.hexdigest()[:32]}"


def _prepared(store: Store, dedup_window: int | None) -> Store:
    """A writable store with its migrations applied and its dedup window set."""
    if not store.read_only:
        try:
            store.migrate()
            if dedup_window is not None:
                store.set_dedup_window(dedup_window)
        except BaseException:
            store.close()
            raise
    return store


def _live(endpoint_url: str) -> bool:
    # A dead holder refuses at once; a busy one (an insert holding the GIL on a loaded
    # machine) may take seconds to answer and is still the one to ask.
    try:
        with urllib.request.urlopen(f"{endpoint_url}/ping", timeout=10) as response:
            return response.status == 200
    except OSError:
        return False


def _open_chdb(url: str, path: str, read_only: bool, dedup_window: int | None) -> Store:
    data_dir = Path(os.path.realpath(path))
    pid = holder_pid(data_dir)
    if pid is None or pid == os.getpid():
        if read_only and not data_dir.is_dir():
            raise StoreError(f"no store at {data_dir} ({url}): nothing has written there yet")
        try:
            return _prepared(Store(url, read_only=read_only, data_dir=data_dir), dedup_window)
        except Exception:
            pid = holder_pid(data_dir)
            if pid is None or pid == os.getpid():
                raise
            # Another process took the directory between the probe and the engine's open.
    holder = f"process {pid}" if pid > 0 else "another process"
    if not read_only:
        raise StoreLockedError(
            f"{data_dir} ({url}) is held by {holder}; a chdb store has one writing process. "
            "Stop it, or point store.url at a ClickHouse server to share one store."
        )
    announced = read_endpoint(data_dir)
    if announced is not None and _live(announced.url):
        return _through(url, announced)
    found = (
        f"its endpoint {announced.url} does not answer"
        if announced is not None
        else f"it serves no read-only endpoint (no {data_dir / ENDPOINT_FILE})"
    )
    raise StoreLockedError(
        f"{data_dir} ({url}) is held by {holder} and {found}. Wait for it to start serving "
        "(store.serve_http = true), stop it, or query a copy of the directory."
    )


def _through(url: str, announced: AnnouncedEndpoint) -> Store:
    if not announced.token:
        raise StoreLockedError(
            f"the endpoint {announced.url} of {url} announced no token; it is an older rlbus: "
            "restart the process holding the store"
        )
    return Store(url, read_only=True, server_url=announced.url, token=announced.token)


def open_store(
    url: str = DEFAULT_STORE_URL, *, read_only: bool = False, dedup_window: int | None = None
) -> Store:
    """Open a store. A writable open applies pending migrations first, then `dedup_window`
    (StoreConfig.dedup_window) when given.

    `chdb://PATH` (relative or `chdb:///absolute`) or `http(s)://[user:pass@]host:port[/db]`.
    Read-only opens of a chdb directory held by another process go through its endpoint;
    writable ones fail with StoreLockedError.
    """
    url = SecretUrl(url)  # its password never reaches a message
    if url.startswith("chdb://"):
        path = url.removeprefix("chdb://")
        if not path:
            raise StoreError(
                f"{url!r} names no directory; use chdb://PATH, e.g. {DEFAULT_STORE_URL}"
            )
        return _open_chdb(url, path, read_only, dedup_window)
    if url.startswith(("http://", "https://")):
        return _prepared(Store(url, read_only=read_only, server_url=url), dedup_window)
    raise StoreError(
        f"unsupported store url {url!r}: use chdb://PATH or http(s)://host:port[/database]"
    )
