"""The holder of a chdb store serves it read-only to other processes over ClickHouse HTTP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError
from support.uvicorn_log import uvicorn_said

from rlbus.bus.store import Store, StoreEndpoint, open_store
from rlbus.bus.store import endpoint as endpoint_module
from rlbus.bus.store.client import _through
from rlbus.bus.store.holder import ENDPOINT_FILE, read_endpoint
from rlbus.schemas import Event, TokenRecord
from rlbus.schemas.packed import pack_logprobs, pack_tokens

CHILD_READS = r"""
import json, sys
import clickhouse_connect
import msgspec
from clickhouse_connect.driver.exceptions import DatabaseError
from rlbus.bus.store import open_store
from rlbus.schemas import TokenRecord

data_dir = sys.argv[1]
url, pid, token = open(f"{data_dir}/.rlbus-endpoint").read().split()  # the URL, PID and token
host, port = url.removeprefix("http://").split(":")
client = clickhouse_connect.get_client(host=host, port=int(port), password=token)
out = {"version": client.server_version}
out["rows"] = client.query(
    "SELECT rollout_id, length(completion_ids) FROM tokens ORDER BY rollout_id").result_rows
out["bound"] = client.query(
    "SELECT count() FROM tokens WHERE rollout_id = {r:String}", parameters={"r": "ro-1"}
).result_rows
out["arrow"] = client.query_arrow(
    "SELECT rollout_id, logprobs FROM tokens ORDER BY rollout_id").to_pylist()
out["command"] = client.command("SELECT count() FROM tokens")
refusals = {
    "insert": lambda: client.insert("tokens", [["x"]], column_names=["rollout_id"]),
    "drop": lambda: client.command("DROP TABLE tokens"),
    "two": lambda: client.command("SELECT 1; DROP TABLE tokens"),
}
for name, attempt in refusals.items():
    try:
        attempt()
        out[name] = "accepted"
    except DatabaseError as exc:
        out[name] = str(exc)
with open_store(f"chdb://{data_dir}", read_only=True) as store:
    out["via"] = store.via
    out["events"] = msgspec.json.encode(store.read_events(TokenRecord)).decode()
    out["jsonl"] = store.query_raw(
        "SELECT rollout_id FROM tokens ORDER BY rollout_id FORMAT JSONEachRow").decode()
print(json.dumps(out, default=repr))
"""

CHILD_OPENS = r"""
import json, sys
from rlbus.bus.store import StoreLockedError, open_store
out = {}
for read_only in (True, False):
    try:
        open_store(f"chdb://{sys.argv[1]}", read_only=read_only).close()
        out[str(read_only)] = "opened"
    except StoreLockedError as exc:
        out[str(read_only)] = str(exc)
print(json.dumps(out))
"""


def run_child(code: str, data_dir: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def at_micros(event: Event) -> Event:
    return msgspec.structs.replace(event, ts=round(event.ts * 1e6) / 1e6)


EVENTS = [
    TokenRecord(
        rollout_id=f"ro-{i}",
        completion_ids=pack_tokens(range(i * 10)),
        logprobs=pack_logprobs([-0.5] * (i * 10)),
        model="tiny",
    )
    for i in range(3)
]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def store(data_dir: Path) -> Iterator[Store]:
    with open_store(f"chdb://{data_dir}") as opened:
        opened.insert_events(EVENTS, [(0, i) for i in range(len(EVENTS))], "tokens:0:0-2")
        yield opened


def http(
    endpoint: StoreEndpoint, sql: str = "", token: str | None = None, **params: str
) -> tuple[int, dict[str, str], bytes]:
    """A request with the endpoint's token (or `token`) as ClickHouse's X-ClickHouse-Key."""
    query = urllib.parse.urlencode(params)
    request = urllib.request.Request(
        f"{endpoint.url}/?{query}",
        data=sql.encode() if sql else None,
        headers={"X-ClickHouse-Key": endpoint.token if token is None else token},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.mark.slow
def test_another_process_queries_through_the_endpoint(store: Store, data_dir: Path) -> None:
    endpoint = store.serve()
    assert read_endpoint(data_dir) == (endpoint.url, endpoint.token)
    assert (data_dir / ENDPOINT_FILE).stat().st_mode & 0o777 == 0o600
    out = run_child(CHILD_READS, data_dir)
    assert out["rows"] == [["ro-0", 0], ["ro-1", 10], ["ro-2", 20]]
    assert out["bound"] == [[1]]
    assert out["command"] == 3
    assert [row["rollout_id"] for row in out["arrow"]] == ["ro-0", "ro-1", "ro-2"]
    assert out["arrow"][1]["logprobs"] == [-0.5] * 10
    for name in ("insert", "drop", "two"):
        assert "164" in out[name] and "is read-only" in out[name], out[name]
    assert "carries an insert" in out["insert"]
    assert "2 statements" in out["two"]
    assert out["via"] == endpoint.url
    assert msgspec.json.decode(out["events"], type=list[TokenRecord]) == [
        at_micros(e) for e in EVENTS
    ]
    assert out["jsonl"] == '{"rollout_id":"ro-0"}\n{"rollout_id":"ro-1"}\n{"rollout_id":"ro-2"}\n'
    assert store.query("SELECT count() FROM tokens").rows == [(3,)]
    store.close()
    assert not (data_dir / ENDPOINT_FILE).exists()


def test_the_endpoint_serves_an_http_store_read_only(store: Store) -> None:
    endpoint = store.serve()
    url = f"http://rlbus:{endpoint.token}@{endpoint.url.removeprefix('http://')}"
    with open_store(url, read_only=True) as remote:
        assert remote.via is None
        assert remote.read_events(TokenRecord) == [at_micros(e) for e in EVENTS]
        assert remote.query("SELECT count() FROM tokens_per_rollout").rows == [(3,)]
        # a reader's settings reach the engine, with readonly kept at 2
        limits = {"max_result_rows": 7, "result_overflow_mode": "break"}
        assert remote.query(
            "SELECT getSetting('readonly'), getSetting('max_result_rows'), "
            "getSetting('result_overflow_mode')",
            settings=limits,
        ).rows == [(2, 7, "break")]
    with pytest.raises(DatabaseError, match="CREATE statements are refused"):
        open_store(url)


@pytest.mark.slow
def test_a_held_store_without_endpoint_says_what_to_do(store: Store, data_dir: Path) -> None:
    out = run_child(CHILD_OPENS, data_dir)
    pid = f"process {os.getpid()}"
    assert pid in out["True"] and "serves no read-only endpoint" in out["True"], out["True"]
    assert pid in out["False"] and "one writing process" in out["False"], out["False"]


@pytest.mark.slow
def test_the_endpoint_speaks_clickhouse_http(store: Store) -> None:
    endpoint = store.serve()
    with urllib.request.urlopen(f"{endpoint.url}/ping", timeout=10) as ping:
        assert ping.read() == b"Ok.\n"
    status, headers, body = http(
        endpoint, "SELECT rollout_id FROM tokens ORDER BY rollout_id FORMAT CSV"
    )
    assert (status, headers["X-ClickHouse-Format"], body) == (
        200,
        "CSV",
        b'"ro-0"\n"ro-1"\n"ro-2"\n',
    )
    status, headers, body = http(
        endpoint,
        query="SELECT length(completion_ids) AS n FROM tokens ORDER BY n",
        default_format="Arrow",
    )
    assert pa.ipc.open_file(body).read_all().column("n").to_pylist() == [0, 10, 20]
    status, headers, body = http(endpoint, "SELECT {n:UInt8} + 1", param_n="41", max_threads="1")
    assert (status, body) == (200, b"42\n")
    status, headers, body = http(endpoint, "INSERT INTO tokens (rollout_id) VALUES ('x')")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (403, "164")
    assert (
        body.startswith(b"Code: 164. DB::Exception: rlbus store endpoint") and b"(READONLY)" in body
    )
    status, headers, body = http(endpoint, "SELECT * FROM no_such_table")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (404, "60")
    status, headers, body = http(endpoint, "SELECT 'unterminated")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (400, "62")
    assert http(endpoint, "SELECT 1", readonly="0", database="default")[2] == b"1\n"


def test_a_reader_cannot_make_the_holder_keep_more_threads_than_cores(store: Store) -> None:
    """The holder's engine keeps every thread a query starts, idle, for the life of the sink
    (tests/store/test_store_threads.py): a reader asking for thousands would leave them there."""
    endpoint = store.serve()
    cores = os.cpu_count() or 1
    status, headers, body = http(endpoint, "SELECT 1", max_threads=str(cores * 1000))
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (400, "452"), body
    assert f"max_threads {cores * 1000}" in body.decode() and f"{cores} cores" in body.decode()
    assert http(endpoint, "SELECT 1", max_threads=str(cores))[:3:2] == (200, b"1\n")
    assert http(endpoint, "SELECT 1", max_threads="auto")[:3:2] == (200, b"1\n")


def test_serving_leaves_the_inserting_thread_alone(store: Store) -> None:
    endpoint = store.serve()
    errors: list[BaseException] = []

    def sink() -> None:
        try:
            for block in range(20):
                batch = [
                    TokenRecord(
                        rollout_id=f"s-{block}-{i}", completion_ids=pack_tokens([block] * 64)
                    )
                    for i in range(100)
                ]
                store.insert_events(
                    batch, [(1, block * 100 + i) for i in range(100)], f"tokens:1:{block}"
                )
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    inserting = threading.Thread(target=sink)
    inserting.start()
    seen = []
    while inserting.is_alive():
        seen.append(int(http(endpoint, "SELECT count() FROM tokens WHERE kafka_partition = 1")[2]))
    inserting.join()
    assert not errors
    assert seen == sorted(seen)
    rows = store.query(
        "SELECT count(), countIf(completion_ids[1] != toUInt32(splitByChar('-', rollout_id)[2])) "
        "FROM tokens WHERE kafka_partition = 1"
    ).rows
    assert rows == [(2000, 0)]


def test_an_endpoint_announced_by_a_dead_process_is_not_read(data_dir: Path) -> None:
    """A holder killed without withdrawing its URL, while its successor has the lock but has not
    announced its own yet: the dead one's URL must not be handed out."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its PID names no process now
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / ENDPOINT_FILE).write_text(f"http://127.0.0.1:9\n{gone.pid}\ntoken\n")
    assert read_endpoint(data_dir) is None
    (data_dir / ENDPOINT_FILE).write_text(f"http://127.0.0.1:9\n{os.getpid()}\ntoken\n")
    assert read_endpoint(data_dir) == ("http://127.0.0.1:9", "token")


@pytest.mark.slow
def test_a_stale_endpoint_file_is_ignored(data_dir: Path) -> None:
    open_store(f"chdb://{data_dir}").close()
    (data_dir / ENDPOINT_FILE).write_text("http://127.0.0.1:9\n")
    with open_store(f"chdb://{data_dir}", read_only=True) as reader:
        assert reader.via is None
        assert reader.query("SELECT count() FROM tokens").rows == [(0,)]


@pytest.mark.slow
def test_chunked_bodies_other_paths_and_idle_clients(store: Store) -> None:
    endpoint = store.serve()
    host, port = endpoint.url.removeprefix("http://").split(":")
    client = HTTPConnection(host, int(port), timeout=10)
    body = iter([b"SELECT count() ", b"FROM tokens"])
    key = {"X-ClickHouse-Key": endpoint.token}
    client.request("POST", "/?default_format=CSV", body=body, headers=key, encode_chunked=True)
    reply = client.getresponse()
    assert (reply.status, reply.read()) == (200, b"3\n")
    client.request("GET", "/nowhere")
    reply = client.getresponse()
    assert (reply.status, reply.read()) == (404, b"no handler for /nowhere\n")
    form = {"Content-Type": "multipart/form-data; boundary=x", **key}
    part = b'Content-Disposition: form-data; name="data"; filename="t.csv"'
    upload = b"--x\r\n" + part + b"\r\n\r\n1\r\n--x--\r\n"
    client.request("POST", "/", body=upload, headers=form)
    reply = client.getresponse()
    assert (reply.status, reply.getheader("X-ClickHouse-Exception-Code")) == (403, "164")
    assert b"uploads are refused" in reply.read()
    client.request("POST", "/", body=b"", headers=key)
    reply = client.getresponse()
    assert (reply.status, reply.getheader("X-ClickHouse-Exception-Code")) == (400, "62")
    assert b"Empty query" in reply.read()
    # One client idle after its answers, one connected that never sends: neither holds up close.
    # Held up, close would wait out its grace for queries in flight and say so in uvicorn's log.
    silent = socket.create_connection((host, int(port)), timeout=60)
    with uvicorn_said() as said:
        store.close()
    assert not [line for line in said if "graceful shutdown exceeded" in line]
    assert silent.recv(1) == b""  # the server closed it rather than waiting for its request
    client.close()
    silent.close()


@pytest.mark.slow
def test_readers_send_bound_values_in_the_body(
    store: Store, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page's list of ids in the URL cost the reader's HTTP client ~1 ms to percent-check;
    in a form body it costs nothing there."""
    seen: list[tuple[str, str]] = []
    handle = endpoint_module._Queries.handle

    async def recording(self: object, request: Any) -> Any:
        seen.append((request.url.query, request.headers.get("Content-Type", "")))
        return await handle(self, request)

    monkeypatch.setattr(endpoint_module._Queries, "handle", recording)
    store.serve()
    ids = ["ro-0", "ro-2", *(f"missing-{i}" for i in range(50))]
    announced = read_endpoint(data_dir)
    assert announced is not None
    with _through(f"chdb://{data_dir}", announced) as reader:  # as another process reads
        rows = reader.query(
            "SELECT rollout_id FROM tokens WHERE rollout_id IN {ids:Array(String)} "
            "ORDER BY rollout_id",
            {"ids": ids},
        ).rows
    assert rows == [("ro-0",), ("ro-2",)]
    query, content_type = seen[-1]
    assert "param_ids" not in query and content_type.startswith("multipart/form-data")
