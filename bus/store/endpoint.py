"""A read-only ClickHouse HTTP interface for a chdb store, served on loopback by its holder.

Only one process can open a chdb data directory, so the process that holds it (the sink)
answers other processes' queries: clickhouse-connect's HTTP client and `rlbus sql` connect to
it as to a ClickHouse server. Each request runs on its own chdb connection, in its own thread,
so it never shares a session with the holder's inserting thread. Responses close the
connection (HTTP/1.0), which lets shutdown wait for in-flight requests without waiting on idle
keep-alive clients.
"""

from __future__ import annotations

import json
import os
import re
import threading
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NoReturn
from urllib.parse import parse_qsl, urlsplit

import chdb

from rlbus.bus.store.holder import withdraw_endpoint, write_endpoint
from rlbus.bus.store.sqltext import (
    SqlTextError,
    quote,
    read_only_problem,
    split_statements,
    trailing_format,
)

# ClickHouse error codes the endpoint answers with.
UNSUPPORTED_METHOD = 1
UNKNOWN_TABLE = 60
SYNTAX_ERROR = 62
UNKNOWN_DATABASE = 81
READONLY = 164
STD_EXCEPTION = 1001

# URL parameters that are not query settings: they steer the HTTP interface, or (readonly) the
# endpoint decides them itself. Every other parameter is applied as a setting.
_TRANSPORT_PARAMS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "user",
        "password",
        "quota_key",
        "query_id",
        "session_id",
        "session_timeout",
        "session_check",
        "compress",
        "decompress",
        "buffer_size",
        "wait_end_of_query",
        "client_protocol_version",
        "role",
        "enable_http_compression",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "readonly",
    }
)
_STATUS_BY_CODE = {
    SYNTAX_ERROR: HTTPStatus.BAD_REQUEST,
    UNKNOWN_TABLE: HTTPStatus.NOT_FOUND,
    UNKNOWN_DATABASE: HTTPStatus.NOT_FOUND,
    READONLY: HTTPStatus.FORBIDDEN,
}
"""As a ClickHouse server answers: unknown table/database 404, syntax 400, read-only 403."""
_CODE = re.compile(r"Code: (\d+)")
_TEXT_FORMATS = ("TabSeparated", "TSV", "CSV", "Pretty", "Vertical", "Markdown", "Values")


class QueryError(Exception):
    """A request that fails with a ClickHouse error code and message."""

    def __init__(self, code: int, message: str, name: str = ""):
        super().__init__(message)
        self.code = code
        self.name = name

    def body(self) -> bytes:
        suffix = f" ({self.name})" if self.name else ""
        return f"Code: {self.code}. DB::Exception: {self}{suffix}\n".encode()


def _refused(message: str) -> QueryError:
    return QueryError(READONLY, message, "READONLY")


def _content_type(fmt: str) -> str:
    if fmt.startswith("JSON"):
        return "application/json; charset=UTF-8"
    if fmt.startswith(_TEXT_FORMATS):
        return "text/plain; charset=UTF-8"
    return "application/octet-stream"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], engine_path: str, timezone: str):
        super().__init__(address, _Handler)
        self.engine_path = engine_path
        self.timezone = timezone


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "rlbus-store"
    timeout = 30.0
    """Seconds a silent client may hold a request thread; shutdown waits for those threads."""

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def log_message(self, format: str, *args: object) -> None:
        """Queries are not logged: the holder's stderr belongs to the run."""

    def _handle(self) -> None:
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        if url.path in ("/ping", "/") and self.command == "GET" and "query" not in params:
            self._reply(HTTPStatus.OK, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
            return
        if url.path != "/":
            self._reply(HTTPStatus.NOT_FOUND, f"no handler for {url.path}\n".encode(), {})
            return
        try:
            body, headers = self._execute(self._statement(params), params)
        except QueryError as exc:
            status = _STATUS_BY_CODE.get(exc.code, HTTPStatus.INTERNAL_SERVER_ERROR)
            self._reply(
                status,
                exc.body(),
                {
                    "X-ClickHouse-Exception-Code": str(exc.code),
                    "Content-Type": "text/plain; charset=UTF-8",
                },
            )
            return
        self._reply(HTTPStatus.OK, body, headers)

    def _statement(self, params: dict[str, str]) -> str:
        """The one read-only statement this request carries, joined as a server joins it: the
        `query` parameter, then the body. Writes are named before the body is judged, so an
        insert is refused as an insert whatever its data looks like."""
        raw = self._body()
        if self.headers.get("Content-Encoding", "identity") != "identity":
            # clickhouse-connect compresses only inserts, with the INSERT inside the body.
            self._refuse_write(
                self._problem(params.get("query", "")) or "a compressed body carries an insert"
            )
        sql = "\n".join(
            part for part in (params.get("query", ""), raw.decode(errors="replace")) if part
        )
        if problem := self._problem(sql):
            self._refuse_write(problem)
        try:
            raw.decode()
        except UnicodeDecodeError as exc:
            raise _refused(
                f"the request body is not UTF-8 SQL ({exc}); data uploads are refused"
            ) from None
        return split_statements(sql)[0]

    @staticmethod
    def _problem(sql: str) -> str | None:
        if not sql:
            return None
        try:
            return read_only_problem(sql)
        except SqlTextError as exc:
            raise QueryError(
                SYNTAX_ERROR, f"cannot parse the query: {exc}", "SYNTAX_ERROR"
            ) from None

    @staticmethod
    def _refuse_write(problem: str) -> NoReturn:
        raise _refused(
            f"rlbus store endpoint (pid {os.getpid()}) is read-only: {problem}; "
            "writes go through the process that holds the store"
        )

    def _body(self) -> bytes:
        if "multipart/form-data" in self.headers.get("Content-Type", ""):
            raise QueryError(
                UNSUPPORTED_METHOD,
                "form-encoded queries are not supported; send the query as the body",
                "UNSUPPORTED_METHOD",
            )
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._chunked_body()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _chunked_body(self) -> bytes:
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline().strip():  # trailer fields
            pass
        return b"".join(chunks)

    def _execute(self, statement: str, params: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        fmt = params.get("default_format") or "TabSeparated"
        bind = {k.removeprefix("param_"): v for k, v in params.items() if k.startswith("param_")}
        settings = {
            k: v
            for k, v in params.items()
            if k not in _TRANSPORT_PARAMS and not k.startswith("param_")
        }
        connection = chdb.connect(self.server.engine_path)
        try:
            # readonly=2 still lets a client change settings, but not readonly itself.
            connection.query("SET readonly = 2")
            for name, value in settings.items():
                connection.query(f"SET {quote(name)} = '{_escape(value)}'")
            if database := params.get("database"):
                connection.query(f"USE {quote(database)}")
            result = connection.query(statement, fmt, params=bind or None)
            body = result.bytes()
            summary = {
                "read_rows": str(result.rows_read()),
                "read_bytes": str(result.bytes_read()),
                "elapsed_ns": str(int(result.elapsed() * 1e9)),
            }
        except Exception as exc:
            message = str(exc)
            match = _CODE.search(message)
            raise QueryError(
                int(match.group(1)) if match else STD_EXCEPTION,
                message.split("DB::Exception: ", 1)[-1],
            ) from None
        finally:
            connection.close()
        fmt = trailing_format(statement) or fmt
        return body, {
            "Content-Type": _content_type(fmt),
            "X-ClickHouse-Format": fmt,
            "X-ClickHouse-Timezone": self.server.timezone,
            "X-ClickHouse-Query-Id": params.get("query_id") or str(uuid.uuid4()),
            "X-ClickHouse-Summary": json.dumps(summary),
        }

    def _reply(self, status: HTTPStatus, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


class Endpoint:
    """Serves read-only queries on the chdb data directory this process holds; announces its
    URL in `<dir>/.rlbus-endpoint` until closed."""

    def __init__(self, data_dir: Path, host: str = "127.0.0.1", port: int = 0):
        engine_path = os.path.realpath(data_dir)
        probe = chdb.connect(engine_path)
        try:
            timezone = probe.query("SELECT timezone()", "TabSeparated").bytes().decode().strip()
        finally:
            probe.close()
        self._server = _Server((host, port), engine_path, timezone)
        self.url = f"http://{host}:{self._server.server_port}"
        self._data_dir = Path(engine_path)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="rlbus-store-endpoint",
            daemon=True,
        )
        self._thread.start()
        write_endpoint(self._data_dir, self.url)

    def close(self) -> None:
        """Stop serving, wait for in-flight requests, and withdraw the URL file."""
        if not self._thread.is_alive():
            return
        withdraw_endpoint(self._data_dir, self.url)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
