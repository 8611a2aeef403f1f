"""A read-only ClickHouse HTTP interface for a chdb store, served on loopback by its holder.

Only one process can open a chdb data directory, so the process that holds it (the sink)
answers other processes' queries: clickhouse-connect's HTTP client and `rlbus sql` connect to
it as to a ClickHouse server, with the token from the endpoint file (bus.store.holder) as the
password. A small Starlette app served by uvicorn on a thread of the holder; each request runs
on its own chdb connection (readonly=2), opened and closed on one worker thread, so it never
shares a session with the holder's inserting thread. Every statement is checked on the
engine's own parse first (bus.store.guard), and only allowed settings are applied. Closing
waits for requests in flight (up to a bound), never for idle keep-alive clients.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import re
import secrets
import uuid
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any, NoReturn

import chdb
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rlbus.bus.server_thread import ServerThread
from rlbus.bus.store.guard import Guard, Refused, check_settings, check_threads
from rlbus.bus.store.holder import HOLDER_READ_SETTINGS, withdraw_endpoint, write_endpoint
from rlbus.bus.store.sqltext import SqlTextError, quote, read_only_problem, trailing_format

# ClickHouse error codes the endpoint answers with.
UNSUPPORTED_METHOD = 1
UNKNOWN_TABLE = 60
SYNTAX_ERROR = 62
UNKNOWN_DATABASE = 81
READONLY = 164
SETTING_CONSTRAINT_VIOLATION = 452
AUTHENTICATION_FAILED = 516
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
    SETTING_CONSTRAINT_VIOLATION: HTTPStatus.BAD_REQUEST,
    AUTHENTICATION_FAILED: HTTPStatus.UNAUTHORIZED,
}
"""As a ClickHouse server answers: unknown table/database 404, syntax 400, read-only 403,
a wrong or missing password 401."""
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


MAX_FORM_BYTES = 64 * 1024 * 1024
"""Largest form-encoded request (clickhouse-connect sends large bound parameters so)."""


class _Queries:
    """Answers one HTTP request with one read-only statement on its own chdb connection."""

    def __init__(self, engine_path: str, timezone: str, token: str):
        self.engine_path = engine_path
        self.timezone = timezone
        self.token = token
        self.guard = Guard()
        self.cores = os.cpu_count() or 1
        """The most threads a reader's query may ask for (guard.check_threads)."""

    async def handle(self, request: Request) -> Response:
        params = dict(request.query_params)  # a repeated parameter counts once: its last value
        path = request.url.path
        if path in ("/ping", "/") and request.method == "GET" and "query" not in params:
            return _reply(HTTPStatus.OK, b"Ok.\n", {"Content-Type": _PLAIN})
        if path != "/":
            return _reply(HTTPStatus.NOT_FOUND, f"no handler for {path}\n".encode(), {})
        try:
            self._authenticate(request.headers, params)
            body = await self._body(request, params)
            answer, headers = await run_in_threadpool(self._answer, params, request.headers, body)
        except QueryError as exc:
            return _reply(
                _STATUS_BY_CODE.get(exc.code, HTTPStatus.INTERNAL_SERVER_ERROR),
                exc.body(),
                {"X-ClickHouse-Exception-Code": str(exc.code), "Content-Type": _PLAIN},
            )
        return _reply(HTTPStatus.OK, answer, headers)

    def _authenticate(self, headers: Mapping[str, str], params: dict[str, str]) -> None:
        """The token as a ClickHouse server takes a password: HTTP basic auth,
        X-ClickHouse-Key, or the `password` parameter."""
        given = headers.get("X-ClickHouse-Key") or params.get("password") or ""
        scheme, _, credentials = headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "basic":
            try:
                given = base64.b64decode(credentials).decode().partition(":")[2]
            except (binascii.Error, UnicodeDecodeError):
                given = ""
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise QueryError(
                AUTHENTICATION_FAILED,
                "Authentication failed: this rlbus store endpoint takes the token from its "
                "endpoint file (<data dir>/.rlbus-endpoint) as the password",
                "AUTHENTICATION_FAILED",
            )

    async def _body(self, request: Request, params: dict[str, str]) -> bytes:
        """The request's SQL. A multipart form (clickhouse-connect's form for bound parameters
        of a few KB and more) carries `query` and `param_*` fields, which join `params`;
        uploaded files (external data) are refused."""
        if "multipart/form-data" not in request.headers.get("Content-Type", ""):
            return await request.body()  # chunked bodies arrive decoded
        try:
            form = await request.form(max_files=16, max_fields=10_000, max_part_size=MAX_FORM_BYTES)
        except HTTPException as exc:
            raise QueryError(
                SYNTAX_ERROR, f"cannot read the form: {exc.detail}", "SYNTAX_ERROR"
            ) from None
        try:
            for name, value in form.multi_items():
                if not isinstance(value, str):
                    raise _refused(f"form field {name!r} uploads data; uploads are refused")
                params[name] = value
        finally:
            await form.close()
        return b""

    def _answer(
        self, params: dict[str, str], headers: Mapping[str, str], body: bytes
    ) -> tuple[bytes, dict[str, str]]:
        sql = self._sql(params, headers, body)
        fmt = params.get("default_format") or "TabSeparated"
        bind = {k.removeprefix("param_"): v for k, v in params.items() if k.startswith("param_")}
        settings = {
            k: v
            for k, v in params.items()
            if k not in _TRANSPORT_PARAMS and not k.startswith("param_")
        }
        try:
            check_settings(settings)
        except Refused as exc:
            self._refuse_write(str(exc))
        try:
            check_threads(settings, self.cores)
        except Refused as exc:
            name = "SETTING_CONSTRAINT_VIOLATION"
            raise QueryError(SETTING_CONSTRAINT_VIOLATION, str(exc), name) from None
        connection = chdb.connect(self.engine_path)
        try:
            statement = self._prepare(connection, sql, bind, settings, params.get("database"))
            result = connection.query(statement, fmt, params=bind or None)
            body = result.bytes()
            summary = {
                "read_rows": str(result.rows_read()),
                "read_bytes": str(result.bytes_read()),
                "elapsed_ns": str(int(result.elapsed() * 1e9)),
            }
        except QueryError:
            raise
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

    def _sql(self, params: dict[str, str], headers: Mapping[str, str], raw: bytes) -> str:
        """The request's SQL, joined as a server joins it: the `query` parameter, then the
        body. Writes are named before the body is judged, so an insert is refused as an insert
        whatever its data looks like."""
        if headers.get("Content-Encoding", "identity") != "identity":
            # clickhouse-connect compresses only inserts, with the INSERT inside the body.
            self._refuse_write(
                self._problem(params.get("query", "")) or "a compressed body carries an insert"
            )
        sql = "\n".join(
            part for part in (params.get("query", ""), raw.decode(errors="replace")) if part
        )
        if not sql.strip():
            raise QueryError(SYNTAX_ERROR, "Empty query", "SYNTAX_ERROR")
        if problem := self._problem(sql):
            self._refuse_write(problem)
        try:
            raw.decode()
        except UnicodeDecodeError as exc:
            raise _refused(
                f"the request body is not UTF-8 SQL ({exc}); data uploads are refused"
            ) from None
        return sql

    def _prepare(
        self,
        connection: Any,
        sql: str,
        bind: dict[str, str],
        settings: dict[str, str],
        database: str | None,
    ) -> str:
        """Set up the request's session (readonly=2: settings may change, readonly may not)
        and return its statement, once the engine's parse of it passed the guard."""
        # One SET for all: readonly first, each a round trip into the engine otherwise.
        chosen = {name: str(value) for name, value in HOLDER_READ_SETTINGS.items()} | settings
        assignments = [f"{quote(name)} = '{_escape(value)}'" for name, value in chosen.items()]
        connection.query(f"SET {', '.join(['readonly = 2', *assignments])}")
        if database:
            connection.query(f"USE {quote(database)}")

        def run(query: str, parameters: Mapping[str, str] | None) -> list[str]:
            out = connection.query(query, "TabSeparatedRaw", params=dict(parameters or {}))
            return out.bytes().decode(errors="replace").split("\n")

        try:
            return self.guard.statement(sql, bind, run)
        except Refused as exc:
            self._refuse_write(str(exc))

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
        raise _refused(f"rlbus store endpoint (pid {os.getpid()}) is read-only: {problem}")


def _reply(status: HTTPStatus, body: bytes, headers: dict[str, str]) -> Response:
    """A response with its header names spelled as ClickHouse spells them (Starlette would
    lower-case them; clients that index a plain dict of headers depend on the spelling)."""
    response = Response(body, status)
    response.raw_headers += [(k.encode(), v.encode()) for k, v in headers.items()]
    return response


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


class StoreEndpoint:
    """Serves read-only queries on the chdb data directory this process holds to clients that
    present its token; announces its URL and token in `<dir>/.rlbus-endpoint` (mode 0600)
    until closed. Binds loopback unless given another host."""

    def __init__(self, data_dir: Path, host: str = "127.0.0.1", port: int = 0):
        engine_path = os.path.realpath(data_dir)
        probe = chdb.connect(engine_path)
        try:
            timezone = probe.query("SELECT timezone()", "TabSeparated").bytes().decode().strip()
        finally:
            probe.close()
        self.token = secrets.token_urlsafe(32)
        queries = _Queries(engine_path, timezone, self.token)
        app = Starlette(routes=[Route("/{path:path}", queries.handle, methods=["GET", "POST"])])
        self._server = ServerThread(
            app, host, port, graceful_s=CLOSE_WAIT_S, name="rlbus-store-endpoint"
        )
        self._server.start()
        self.url = self._server.url
        self._data_dir = Path(engine_path)
        write_endpoint(self._data_dir, self.url, self.token)

    def close(self) -> None:
        """Withdraw the URL file, stop serving, and wait for queries in flight."""
        withdraw_endpoint(self._data_dir, self.url)
        self._server.close()
