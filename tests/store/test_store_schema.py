"""The migrated tables match the event Structs; migrations apply once; the views compute."""

from __future__ import annotations

import datetime
import difflib
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import chdb
import clickhouse_connect
import pytest

from rlbus.bus.store import MigrationError, Store, columns, open_store
from rlbus.bus.store.columns import columns_of, extra_columns
from rlbus.bus.store.ddl import SERIAL_PART_REMOVAL, id_columns
from rlbus.bus.store.migrate import Migration, load_migrations, migrate
from rlbus.bus.store.sqltext import read_only_problem, split_statements
from rlbus.config.settings import DEFAULT_DEDUP_WINDOW
from rlbus.consumers.sink.sink import RECENT_IDS
from rlbus.schemas import EVENT_TYPES, DeadLetter, RolloutScored, TokenRecord
from rlbus.schemas.packed import pack_tokens


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"chdb://{tmp_path / 'data'}") as opened:
        yield opened


def test_migrated_tables_match_the_structs(store: Store) -> None:
    # Compared by name, not position: ALTER TABLE ADD COLUMN appends after ingested_at.
    problems = []
    for kind in EVENT_TYPES:
        described = store.query(f"DESCRIBE TABLE `{kind.table}`").rows
        actual = sorted(
            f"{name} {ch_type} {default_kind} {expr}".strip()
            for name, ch_type, default_kind, expr, *_ in described
        )
        expected = sorted(
            [f"{c.name} {c.ch_type}" for c in columns_of(kind)]
            + [f"{c.name} {c.spec}" for c in extra_columns(kind)]
        )
        if actual != expected:
            diff = difflib.unified_diff(
                expected,
                actual,
                f"{kind.__name__} (schemas/events.py)",
                f"{kind.table} (migrated)",
                lineterm="",
            )
            problems.append("\n".join(diff))
    assert not problems, (
        "the migrations and the event Structs disagree; add a numbered migration under "
        "bus/store/migrations that brings the tables in line:\n" + "\n\n".join(problems)
    )


def test_tables_are_keyed_indexed_and_deduplicated_as_declared(store: Store) -> None:
    tables = {
        name: (engine, sorting_key, engine_full)
        for name, engine, sorting_key, engine_full in store.query(
            "SELECT name, engine, sorting_key, engine_full FROM system.tables "
            "WHERE database = currentDatabase()"
        ).rows
    }
    indexes = store.query(
        "SELECT table, groupArray(expr) FROM system.data_skipping_indices "
        "WHERE database = currentDatabase() AND type = 'bloom_filter' GROUP BY table"
    ).rows
    bloom = {table: sorted(exprs) for table, exprs in indexes}
    for kind in EVENT_TYPES:
        engine, sorting_key, engine_full = tables[kind.table]
        assert engine == "ReplacingMergeTree", kind.table
        assert sorting_key == ", ".join(columns.sorting_key(kind)), kind.table
        assert f"non_replicated_deduplication_window = {DEFAULT_DEDUP_WINDOW}" in engine_full, (
            kind.table
        )
        assert bloom[kind.table] == sorted(id_columns(kind)), kind.table
        assert "event_id" in id_columns(kind) or kind.order_by[0] == "event_id"


def test_every_table_removes_old_parts_on_one_thread(store: Store) -> None:
    tables = store.query(
        "SELECT name, engine_full FROM system.tables "
        "WHERE database = currentDatabase() AND engine LIKE '%MergeTree'"
    ).rows
    assert len(tables) >= 10
    # tests/store/test_store_threads.py shows why
    setting = f"concurrent_part_removal_threshold = {SERIAL_PART_REMOVAL}"
    assert [name for name, engine_full in tables if setting not in engine_full] == []


def test_the_conflict_check_reads_only_parts_stored_since_its_last_look(store: Store) -> None:
    """The sink's conflict check runs every few seconds over every table; its filter on
    ingested_at must skip what was stored before, or its cost grows with the store."""
    for day in ("2026-01-01", "2026-06-01"):  # two inserts: two parts
        store.query(
            "INSERT INTO scored (event_id, rollout_id, ingested_at) SELECT toString(number), "
            f"toString(number), toDateTime64('{day} 00:00:00', 6, 'UTC') FROM numbers(20000)"
        )
    since = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
    plan = [
        row[0].strip()
        for row in store.query(
            "EXPLAIN indexes = 1 " + RECENT_IDS.format(table="scored"), {"since": since}
        ).rows
    ]
    skip = plan[plan.index("Name: idx_ingested_at") :]
    assert next(line for line in skip if line.startswith("Parts:")) == "Parts: 1/2", plan
    recent = store.query(RECENT_IDS.format(table="scored"), {"since": since}).rows
    assert len(recent) == 20000


def test_reads_of_a_held_chdb_store_fill_no_query_condition_cache(store: Store) -> None:
    """chdb's query condition cache keeps an entry per part for every filter it evaluates, with
    its constants, counted at a third of its size against a 100 MiB limit: a process that holds
    a store and answers reads whose constants change (a dashboard's bounds, a user's ids) grew
    ~1 KB a read for hours. The reads of the process that holds a chdb store, its own and its
    endpoint's, go without the cache (docs/benchmarks.md, "Where the sink's engine memory
    went")."""
    for part in range(2):
        store.query(
            "INSERT INTO scored (event_id, rollout_id) SELECT toString(number), "
            f"toString(number) FROM numbers({part * 2000}, 2000)"
        )
    for bound in range(10):
        store.query(f"SELECT count() FROM scored WHERE scorer_version = 'v{bound}'")
    endpoint = store.serve()
    sql = "SELECT count() FROM scored WHERE scorer_version != 'v77'"
    request = urllib.request.Request(
        f"{endpoint.url}/?query={urllib.parse.quote(sql)}",
        headers={"X-ClickHouse-Key": endpoint.token},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert int(response.read()) == 4000
    assert store.query("SELECT count() FROM system.query_condition_cache").rows == [(0,)]


def test_the_dedup_window_follows_the_config(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'data'}"
    open_store(url).close()
    with open_store(url, dedup_window=500) as store:
        windows = store.query(
            "SELECT DISTINCT extract(engine_full, 'deduplication_window = ([0-9]+)') "
            "FROM system.tables WHERE database = currentDatabase() AND engine LIKE '%MergeTree' "
            "AND name != 'schema_migrations'"
        ).rows
        assert windows == [("500",)]


def test_migrations_apply_once(store: Store, tmp_path: Path) -> None:
    names = [m.name for m in load_migrations()]
    assert names[:2] == ["0001_events.sql", "0002_views.sql"]
    assert store.migrate() == []
    assert [
        r[0] for r in store.query("SELECT name FROM schema_migrations FINAL ORDER BY version").rows
    ] == names
    store.close()
    with open_store(f"chdb://{tmp_path / 'data'}") as reopened:
        assert reopened.migrate() == []
        assert reopened.query("SELECT count() FROM schema_migrations").rows == [(len(names),)]


def test_migration_runner_records_only_what_succeeded(tmp_path: Path) -> None:
    client = clickhouse_connect.get_client(interface="chdb", path=str(tmp_path / "data"))
    try:
        good = Migration(
            1, "0001_t.sql", "CREATE TABLE IF NOT EXISTS t (a Int64) ENGINE = MergeTree ORDER BY a;"
        )
        broken = Migration(
            2,
            "0002_u.sql",
            "-- ; not a statement\nCREATE VIEW IF NOT EXISTS v AS SELECT a FROM t;\n"
            "CREATE TABLE u (a Nope) ENGINE = Memory;",
        )
        with pytest.raises(MigrationError, match=r"0002_u.sql, statement 2 failed: .*Nope"):
            migrate(client, [good, broken], views=[])
        assert client.query("SELECT version FROM schema_migrations FINAL").result_rows == [(1,)]
        fixed = Migration(2, "0002_u.sql", broken.sql.replace("Nope", "Int64"))
        assert migrate(client, [good, fixed], views=[]) == ["0002_u.sql"]
        assert migrate(client, [good, fixed], views=[]) == []
        edited = Migration(1, "0001_t.sql", good.sql + "\n-- edited")
        with pytest.raises(MigrationError, match=r"0001_t\.sql differs .* new numbered migration"):
            migrate(client, [edited, fixed], views=[])
    finally:
        client.close()


def test_views_compute_rewards_pass_rates_tokens_and_dead_letters(store: Store) -> None:
    scored = [
        RolloutScored(
            run_id="r",
            rollout_id="a",
            group_id="g",
            task_id="t1",
            env="math",
            reward=1.0,
            policy_version=1,
        ),
        RolloutScored(
            run_id="r",
            rollout_id="b",
            group_id="g",
            task_id="t1",
            env="math",
            reward=0.5,
            policy_version=1,
        ),
        RolloutScored(
            run_id="r",
            rollout_id="c",
            group_id="g",
            task_id="t2",
            env="math",
            status="error",
            policy_version=1,
        ),
        RolloutScored(
            run_id="r",
            rollout_id="d",
            group_id="h",
            task_id="t3",
            env="code",
            reward=1.0,
            policy_version=2,
        ),
    ]
    store.insert_events(scored, [(0, i) for i in range(4)], "scored:0:0-3")
    store.insert_events(scored[:1], [(0, 0)], "scored:0:0 redelivered")
    assert store.query(
        "SELECT step, rollouts, errors, mean_reward, pass_rate FROM reward_by_step ORDER BY step"
    ).rows == [
        (1, 3, 1, 0.75, 0.5),
        (2, 1, 0, 1.0, 1.0),
    ]
    assert store.query(
        "SELECT env, tasks, rollouts, mean_reward, pass_rate FROM env_pass_rate ORDER BY env"
    ).rows == [
        ("code", 1, 1, 1.0, 1.0),
        ("math", 2, 3, 0.75, 0.5),
    ]
    tokens = [
        TokenRecord(
            run_id="r",
            rollout_id="a",
            call_index=i,
            prompt_ids=pack_tokens(range(10 + i)),
            completion_ids=pack_tokens(range(5)),
            policy_version=i,
        )
        for i in range(2)
    ]
    store.insert_events(tokens, [(0, 0), (0, 1)], "tokens:0:0-1")
    assert store.query(
        "SELECT rollout_id, calls, prompt_tokens, completion_tokens, min_policy_version, "
        "max_policy_version FROM tokens_per_rollout"
    ).rows == [("a", 2, 21, 10, 0, 1)]
    letters = [
        DeadLetter(
            run_id="r",
            origin_topic="rlbus.rollouts",
            origin_partition=0,
            origin_offset=i,
            consumer_group="judge",
            error=f"bad {i}",
            ts=1000.0 + i,
        )
        for i in range(3)
    ]
    store.insert_events(letters, [(0, i) for i in range(3)], "dlq:0:0-2")
    assert store.query(
        "SELECT origin_topic, consumer_group, messages, last_error FROM dead_letters_by_topic"
    ).rows == [
        ("rlbus.rollouts", "judge", 3, "bad 2"),
    ]


@pytest.mark.parametrize(
    ("script", "statements"),
    [
        ("SELECT 1; SELECT 2;", ["SELECT 1", "SELECT 2"]),
        ("SELECT ';' -- ; trailing\n; -- only a comment ;\n", ["SELECT ';'"]),
        (
            "SELECT 'it''s;' AS \"a;b\", 'x\\';' AS `c;d`",
            ["SELECT 'it''s;' AS \"a;b\", 'x\\';' AS `c;d`"],
        ),
        (
            "/* a /* nested ; */ still ; */ SELECT 1; SELECT $tag$;$tag$",
            ["SELECT 1", "SELECT $tag$;$tag$"],
        ),
        ("SELECT 1 --c\r;SELECT 2", ["SELECT 1"]),
        ("SELECT 1 # ;\n;SELECT 3 AS a$b ;", ["SELECT 1", "SELECT 3 AS a$b"]),
    ],
)
@pytest.mark.slow
def test_scripts_split_on_semicolons_as_clickhouse_does(
    store: Store, script: str, statements: list[str]
) -> None:
    assert split_statements(script) == statements
    assert store.data_dir is not None
    engine = chdb.connect(str(store.data_dir))
    try:
        whole = engine.query(script, "TabSeparated").bytes()
        one_by_one = b"".join(engine.query(s, "TabSeparated").bytes() for s in statements)
    finally:
        engine.close()
    assert whole == one_by_one


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        ("SELECT 1", None),
        ("  (SELECT 1) UNION ALL (SELECT 2);", None),
        ("WITH 1 AS x SELECT x", None),
        ("-- why\nSHOW TABLES", None),
        ("DESCRIBE TABLE tokens", None),
        ("SELECT 'INSERT INTO t' FORMAT JSON", None),
        ("INSERT INTO tokens VALUES (1)", "INSERT statements are refused"),
        ("drop table tokens", "DROP statements are refused"),
        ("SELECT 1; DROP TABLE tokens", "2 statements"),
        ("SELECT 1 INTO OUTFILE '/tmp/x'", "INTO OUTFILE"),
        ("", "empty query"),
    ],
)
def test_read_only_access_allows_only_one_read(sql: str, problem: str | None) -> None:
    found = read_only_problem(sql)
    assert (found is None) if problem is None else (problem in (found or "")), found
