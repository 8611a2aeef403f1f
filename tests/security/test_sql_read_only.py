"""Issue 13, finding 1: read-only SQL reads no file, makes no request, runs no program and
writes nothing, on every query path: chdb opened directly (`rlbus sql` with no holder), the
holder's endpoint, and an HTTP ClickHouse server (the endpoint, reached as a server)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import chdb
import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError
from security_sql import CANARY, Target, make_target

from rlbus.bus.store import Store, StoreError, open_store
from rlbus.bus.store.guard import Guard, Refused
from rlbus.bus.store.holder import ENDPOINT_FILE


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Target]:
    yield from make_target(tmp_path)


def refused_everywhere(target: Target, query: Callable[[str], object]) -> None:
    for name, (sql, named) in target.attacks().items():
        try:
            result = query(sql)
        except (StoreError, DatabaseError) as exc:
            assert named in str(exc), f"{name}: {exc}"
            assert CANARY not in str(exc)
            continue
        pytest.fail(f"{name} ran: {result!r}")
    target.untouched()


def test_chdb_opened_directly_is_read_only(target: Target) -> None:
    """`rlbus sql` with no holder: the store is opened in-process, with readonly=2."""
    with open_store(f"chdb://{target.data_dir}", read_only=True) as store:
        assert store.via is None and store.data_dir is not None
        refused_everywhere(target, lambda sql: store.query(sql))
        assert store.query("SELECT getSetting('readonly')").rows == [(2,)]
        assert store.query("SELECT count() FROM tokens").rows == [(1,)]  # DROP never ran


@pytest.mark.slow
def test_rlbus_sql_refuses_and_names_the_function(target: Target) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rlbus", "sql",
         f"SELECT * FROM file('{target.secret}', 'LineAsString')",
         "--store.url", f"chdb://{target.data_dir}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "file() is refused" in done.stderr and CANARY not in done.stdout + done.stderr


@pytest.fixture
def holder(target: Target) -> Iterator[Store]:
    with open_store(f"chdb://{target.data_dir}") as store:
        store.serve()
        yield store


@pytest.mark.slow
def test_the_endpoint_needs_its_token_and_refuses_external_access(
    target: Target, holder: Store
) -> None:
    endpoint_file = target.data_dir / ENDPOINT_FILE
    assert endpoint_file.stat().st_mode & 0o777 == 0o600
    url, _, token = endpoint_file.read_text().split()
    for password in ("", "wrong"):
        request = urllib.request.Request(
            f"{url}/?query=SELECT+1", headers={"X-ClickHouse-Key": password}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401
        assert refused.value.headers["X-ClickHouse-Exception-Code"] == "516"
    host, port = url.removeprefix("http://").split(":")
    client = clickhouse_connect.get_client(host=host, port=int(port), password=token)
    refused_everywhere(target, lambda sql: client.query(sql))
    big = "x" * 20_000  # clickhouse-connect sends a multipart form for bound values this big
    assert client.query("SELECT length({v:String})", parameters={"v": big}).result_rows == [
        (20_000,)
    ]


@pytest.mark.slow
def test_readers_through_the_endpoint_and_as_a_server_are_read_only(
    target: Target, holder: Store
) -> None:
    other_process = r"""
import json, sys
from rlbus.bus.store import open_store
with open_store(f"chdb://{sys.argv[1]}", read_only=True) as store:
    out = {"via": store.via}
    for sql in json.loads(sys.argv[2]):
        try:
            out[sql] = repr(store.query(sql).rows)
        except Exception as exc:
            out[sql] = "refused: " + str(exc)
print(json.dumps(out))
"""
    queries = [sql for sql, _ in target.attacks().values()]
    done = subprocess.run(
        [sys.executable, "-c", other_process, str(target.data_dir), json.dumps(queries)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out.pop("via")
    for name, (sql, named) in target.attacks().items():
        assert out[sql].startswith("refused: ") and named in out[sql], (name, out[sql])
    url, _, token = (target.data_dir / ENDPOINT_FILE).read_text().split()
    with open_store(f"http://rlbus:{token}@{url.removeprefix('http://')}", read_only=True) as s:
        refused_everywhere(target, lambda sql: s.query(sql))
        assert s.query("SELECT count() FROM tokens").rows == [(1,)]


def test_the_stores_parameterized_views_read_like_table_functions_and_nothing_else_does(
    target: Target, holder: Store
) -> None:
    """`scores_at(version = ...)` sits where a table function goes; an unknown name there is
    refused by name."""
    url, _, token = (target.data_dir / ENDPOINT_FILE).read_text().split()
    reader = clickhouse_connect.get_client(dsn=url, password=token)
    assert reader.query("SELECT count() FROM scores_at(version = '')").result_rows == [(0,)]
    with pytest.raises(DatabaseError, match=r"nosuchthing\(\) is refused"):
        reader.query("SELECT * FROM nosuchthing(1)")
    reader.close()


def test_the_guard_parses_a_statement_text_once_and_refuses_on_every_parse(
    target: Target, holder: Store
) -> None:
    """A statement text the engine's parse passed is not parsed again (a page sends the same
    texts again and again); a refused one is parsed and refused each time, and a parameter
    that names a table or column (Identifier) is part of what was passed."""
    connection = chdb.connect(str(target.data_dir))  # the holder's engine, as the endpoint uses it
    sent: list[str] = []

    def run(query: str, parameters: object) -> list[str]:
        sent.append(query)
        out = connection.query(query, "TabSeparatedRaw", params=dict(parameters or {}))
        return out.bytes().decode().split("\n")

    guard = Guard()
    sql = "SELECT count() FROM tokens WHERE run_id = {run:String}"
    assert guard.statement(sql, {"run": "a"}, run) == sql
    parses = len(sent)
    assert parses >= 2  # formatQuerySingleLine and EXPLAIN AST (and the denied names once)
    assert guard.statement(sql, {"run": "b"}, run) == sql
    assert len(sent) == parses
    for _ in range(2):
        with pytest.raises(Refused, match=r"file\(\) is refused"):
            guard.statement(f"SELECT * FROM file('{target.secret}', 'LineAsString')", None, run)
    assert len(sent) == parses + 4
    named = "SELECT count() FROM {table:Identifier}"
    guard.statement(named, {"table": "tokens"}, run)
    guard.statement(named, {"table": "rollouts"}, run)
    assert len(sent) == parses + 8
    connection.close()
