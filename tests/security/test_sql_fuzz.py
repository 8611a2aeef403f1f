"""Issue 13, finding 1, fuzzed: a few hundred generated hostile queries (a seeded generator)
through the store's read path, opened directly and through the holder's endpoint. None reads a
file, makes a request, runs a program or writes."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import clickhouse_connect
import pytest
from security_sql import CANARY, Target, make_target

from rlbus.bus.store import open_store
from rlbus.bus.store.holder import ENDPOINT_FILE


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Target]:
    yield from make_target(tmp_path)


SEED = 13
COUNT = 300


def hostile_queries(t: Target, rng: random.Random) -> Iterator[str]:
    """Dangerous sources in every position ClickHouse takes a table or an expression, spelled
    in the ways its parser accepts, with write and settings tails; plus plain writes."""
    url = t.listener
    sources = [
        f"file('{t.secret}', 'LineAsString')",
        "file('/proc/self/environ', 'LineAsString')",
        f"url('{url}/u', 'CSV', 'a String')",
        f"s3('{url}/b/k', 'CSV', 'a String')",
        f"urlCluster('default', '{url}/c', 'CSV', 'a String')",
        "executable('rlbus_probe.sh', 'TSV', 'a String')",
        "remote('127.0.0.1:9000', system.one)",
        "remoteSecure('127.0.0.1:9440', system.one)",
        "mysql('127.0.0.1:3306', 'd', 't', 'u', 'p')",
        "postgresql('127.0.0.1:5432', 'd', 't', 'u', 'p')",
        "hdfs('hdfs://127.0.0.1:9000/x', 'CSV', 'a String')",
        "input('a String')",
        "merge('default', '.*')",
        f"view(SELECT * FROM file('{t.secret}', 'LineAsString'))",
        f"loop(file('{t.secret}', 'LineAsString'))",
        "dictionary('d')",
        f"fileCluster('default', '{t.secret}', 'LineAsString')",
        "python(secret)",
        f"format(LineAsString, (SELECT file('{t.secret}')))",
    ]
    scalars = [
        f"file('{t.secret}')",
        "dictGet('d', 'a', toUInt64(1))",
        "dictGetString('d', 'a', toUInt64(1))",
        f"catboostEvaluate('{t.secret}', 1)",
    ]
    writes = [
        "DROP TABLE tokens",
        "INSERT INTO tokens (rollout_id) VALUES ('x')",
        f"INSERT INTO FUNCTION file('{t.outfile}', 'CSV', 'a String') VALUES ('x')",
        "CREATE TABLE pwn (a String) ENGINE = Memory",
        "ALTER TABLE tokens DELETE WHERE 1",
        "TRUNCATE TABLE tokens",
        "OPTIMIZE TABLE tokens FINAL",
        "SYSTEM DROP QUERY CACHE",
        "SET readonly = 0",
        "RENAME TABLE tokens TO gone",
        "DETACH TABLE tokens",
        "KILL QUERY WHERE 1",
        "CREATE FUNCTION pwn AS (x) -> x",
        f"BACKUP TABLE tokens TO File('{t.outfile}')",
    ]
    tails = [
        "",
        f" INTO OUTFILE '{t.outfile}'",
        " INTO OUTFILE 'rlbus-fuzz-out.tsv'",
        " SETTINGS allow_introspection_functions = 1",
        " FORMAT TSV",
        " -- ; DROP TABLE tokens",
    ]

    def spell(name_call: str) -> str:
        name, _, rest = name_call.partition("(")
        choice = rng.randrange(6)
        if choice == 1:
            name = name.upper()
        elif choice == 2:
            name = f"`{name}`"
        elif choice == 3:
            name = f"default.{name}"
        elif choice == 4:
            name = f"{name} /* c */"
        elif choice == 5:
            name = name.capitalize()
        return f"{name}({rest}"

    shapes = [
        "SELECT * FROM {src}",
        "SELECT * FROM tokens AS a JOIN {src} AS b ON 1",
        "SELECT * FROM tokens WHERE rollout_id IN (SELECT * FROM {src})",
        "WITH x AS (SELECT * FROM {src}) SELECT * FROM x",
        "SELECT (SELECT any(*) FROM {src})",
        "DESCRIBE {src}",
        "DESC TABLE {src}",
        "EXPLAIN SELECT * FROM {src}",
        "EXPLAIN PIPELINE SELECT * FROM {src}",
        "EXPLAIN QUERY TREE SELECT * FROM {src}",
        "EXPLAIN ESTIMATE SELECT * FROM {src}",
        "SELECT 1 UNION ALL SELECT count() FROM {src}",
        "SELECT exists(SELECT * FROM {src})",
        "(SELECT * FROM {src})",
        "SELECT * FROM numbers(1) WHERE number IN {src}",
        "SELECT * FROM numbers(1) ARRAY JOIN [1] AS x JOIN {src} AS y ON 1",
        "SELECT {scalar}",
        "SELECT length({scalar}) FROM numbers(1)",
        "SELECT * FROM numbers(1) WHERE {scalar} != ''",
        "SELECT 1; {write}",
        "{write}",
        "/* read */ {write}",
        "( {write} )",
        "SELECT 1 -- x\n; {write}",
        "EXPLAIN PIPELINE {write}",
        "SELECT 1 AS `a\n Set`, * FROM {src}",
    ]
    for _ in range(COUNT):
        shape = rng.choice(shapes)
        sql = shape.format(
            src=spell(rng.choice(sources)),
            scalar=spell(rng.choice(scalars)),
            write=rng.choice(writes),
        )
        if rng.random() < 0.5:
            sql += rng.choice(tails)
        if rng.random() < 0.2:
            sql = sql.lower() if rng.random() < 0.5 else sql.replace(" ", "\n\t ")
        yield sql


def run_all(query, queries: list[str]) -> list[str]:  # type: ignore[no-untyped-def]
    outputs = []
    for sql in queries:
        try:
            outputs.append(repr(query(sql)))
        except Exception as exc:  # refusals and the engine's own errors
            outputs.append(str(exc))
    return outputs


def assert_harmless(t: Target, outputs: list[str], cwd: Path) -> None:
    assert not [o for o in outputs if CANARY in o], "a file was read"
    assert not [o for o in outputs if "ran" == o.strip("[()],'\" ")], "a script's output came back"
    t.untouched()
    assert not (cwd / "rlbus-fuzz-out.tsv").exists()


@pytest.mark.slow
def test_generated_hostile_queries_read_request_run_and_write_nothing(
    target: Target,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # where a relative INTO OUTFILE would land
    queries = list(hostile_queries(target, random.Random(SEED)))
    assert len(set(queries)) > 250
    with open_store(f"chdb://{target.data_dir}", read_only=True) as store:
        direct = run_all(lambda sql: store.query(sql).rows, queries)
    assert_harmless(target, direct, tmp_path)
    with open_store(f"chdb://{target.data_dir}") as holder:
        holder.serve()
        url, _, token = (target.data_dir / ENDPOINT_FILE).read_text().split()
        host, port = url.removeprefix("http://").split(":")
        client = clickhouse_connect.get_client(host=host, port=int(port), password=token)
        served = run_all(lambda sql: client.query(sql).result_rows, queries)
        assert_harmless(target, served, tmp_path)
        rows = holder.query("SELECT count() FROM tokens").rows
        tables = holder.query("SELECT count() FROM system.tables WHERE database = 'default'").rows
    assert rows == [(1,)]
    with open_store(f"chdb://{target.data_dir}", read_only=True) as store:
        assert (
            store.query("SHOW TABLES").rows
            and tables
            == store.query("SELECT count() FROM system.tables WHERE database = 'default'").rows
        )
    refused = sum("refused" in o or "read-only" in o for o in direct)
    assert refused > 0.9 * len(queries), f"only {refused} of {len(queries)} were refused by name"
