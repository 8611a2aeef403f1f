"""A read-only ClickHouse HTTP interface for a chdb store, served on loopback by its holder.

Only one process can open a chdb data directory, so the process that holds it (the sink)
answers other processes' queries: clickhouse-connect's HTTP client and `rlbus sql` connect to
it as to a ClickHouse server. A small Starlette app served by uvicorn on a thread of the holder;
each request runs on its own chdb connection, opened and closed on one worker thread, so it
never shares a session with the holder's inserting thread. Closing waits for requests in
flight (up to a bound), never for idle keep-alive clients.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path
from typing import NoReturn

import chdb
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rlbus.bus.server_thread import ServerThread
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
_PLAIN = "text/plain; charset=UTF-8"
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
        return _PLAIN
    return "application/octet-stream"


CLOSE_WAIT_S = 10
"""Seconds closing the endpoint waits for queries in flight before dropping them."""


class _Queries:
    """Answers one HTTP request with one read-only statement on its own chdb connection."""

    def __init__(self, engine_path: str, timezone: str):
        self.engine_path = engine_path
        self.timezone = timezone

    async def handle(self, request: Request) -> Response:
        params = dict(request.query_params)  # a repeated parameter counts once: its last value
        path = request.url.path
        if path in ("/ping", "/") and request.method == "GET" and "query" not in params:
            return _reply(HTTPStatus.OK, b"Ok.\n", {"Content-Type": _PLAIN})
        if path != "/":
            return _reply(HTTPStatus.NOT_FOUND, f"no handler for {path}\n".encode(), {})
        try:
            if "multipart/form-data" in request.headers.get("Content-Type", ""):
                raise QueryError(
                    UNSUPPORTED_METHOD,
                    "form-encoded queries are not supported; send the query as the body",
                    "UNSUPPORTED_METHOD",
                )
            body = await request.body()  # chunked bodies arrive decoded
            answer, headers = await run_in_threadpool(self._answer, params, request.headers, body)
        except QueryError as exc:
            return _reply(
                _STATUS_BY_CODE.get(exc.code, HTTPStatus.INTERNAL_SERVER_ERROR),
                exc.body(),
                {"X-ClickHouse-Exception-Code": str(exc.code), "Content-Type": _PLAIN},
            )
        return _reply(HTTPStatus.OK, answer, headers)

    def _answer(
        self, params: dict[str, str], headers: Mapping[str, str], body: bytes
    ) -> tuple[bytes, dict[str, str]]:
        return self._execute(self._statement(params, headers, body), params)

    def _statement(self, params: dict[str, str], headers: Mapping[str, str], raw: bytes) -> str:
        """The one read-only statement this request carries, joined as a server joins it: the
        `query` parameter, then the body. Writes are named before the body is judged, so an
        insert is refused as an insert whatever its data looks like."""
        if headers.get("Content-Encoding", "identity") != "identity":
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

    def _execute(self, statement: str, params: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        fmt = params.get("default_format") or "TabSeparated"
        bind = {k.removeprefix("param_"): v for k, v in params.items() if k.startswith("param_")}
        settings = {
            k: v
            for k, v in params.items()
            if k not in _TRANSPORT_PARAMS and not k.startswith("param_")
        }
        connection = chdb.connect(self.engine_path)
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
            "X-ClickHouse-Timezone": self.timezone,
            "X-ClickHouse-Query-Id": params.get("query_id") or str(uuid.uuid4()),
            "X-ClickHouse-Summary": json.dumps(summary),
        }


def _reply(status: HTTPStatus, body: bytes, headers: dict[str, str]) -> Response:
    """A response with its header names spelled as ClickHouse spells them (Starlette would
    lower-case them; clients that index a plain dict of headers depend on the spelling)."""
    response = Response(body, status)
    response.raw_headers += [(k.encode(), v.encode()) for k, v in headers.items()]
    return response


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
        queries = _Queries(engine_path, timezone)
        app = Starlette(routes=[Route("/{path:path}", queries.handle, methods=["GET", "POST"])])
        self._server = ServerThread(
            app, host, port, graceful_s=CLOSE_WAIT_S, name="rlbus-store-endpoint"
        )
        self._server.start()
        self.url = self._server.url
        self._data_dir = Path(engine_path)
        write_endpoint(self._data_dir, self.url)

    def close(self) -> None:
        """Withdraw the URL file, stop serving, and wait for queries in flight."""
        withdraw_endpoint(self._data_dir, self.url)
        self._server.close()
