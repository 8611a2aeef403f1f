"""Views are defined once, in bus/store/views, and re-applied on every migrate; migrations hold
tables only. Stores migrated by the files from before views moved keep opening and read the
same."""

from __future__ import annotations

from pathlib import Path

import clickhouse_connect
import msgspec
import pytest
from support.factories import make_event

from rlbus.bus.store import MigrationError, Store, open_store
from rlbus.bus.store.migrate import Migration, load_migrations, load_views, migrate
from rlbus.bus.store.sqltext import split_statements, words
from rlbus.schemas import EVENT_TYPES, Event, RolloutCompleted

BEFORE_VIEWS = Path(__file__).parent / "migrations_before_views"
"""0002, 0004, 0005 and 0006 as stores applied them before their views moved (byte for byte:
stores recorded these texts' checksums)."""

ViewState = dict[str, tuple[str, tuple[str, ...], list[str]]]


def migrations_before_views() -> list[Migration]:
    by_version = {m.version: m for m in load_migrations()}
    by_version |= {m.version: m for m in load_migrations(BEFORE_VIEWS)}
    return [by_version[v] for v in sorted(by_version)]


VIEWS_ADDED_SINCE = {"weight_updates", "held_out_by_env_at", "held_out_by_env"}
"""Views first defined after views moved out of the migrations: an old store gains them when it
migrates, as a fresh one has them."""
VIEWS_CHANGED_SINCE = {"staleness", "throughput", "conflicts", "latency", "errors_by_kind_at"}
"""Views whose files changed after the move (a step trained again counts once; conflicts covers
the run health tables; a rollout stored with two contents counts once): an old store reads them
as a fresh one does once it migrates."""


def old_store(path: Path, migrations: list[Migration]) -> None:
    """A store migrated as before views moved: `migrations`, and no views but theirs."""
    client = clickhouse_connect.get_client(interface="chdb", path=str(path))
    try:
        assert migrate(client, migrations, views=[]) == [m.name for m in migrations]
    finally:
        client.close()


def fill(store: Store, events: list[list[Event]]) -> None:
    for partition, of_kind in enumerate(events):
        store.insert_events(of_kind, [(partition, i) for i in range(len(of_kind))])


def view_state(store: Store) -> ViewState:
    """Each view's definition as ClickHouse holds it, its columns and its rows (as text, so
    that nan equals nan); a parameterized `NAME_at` is read at version ''."""
    state: ViewState = {}
    for name, definition in store.query(
        "SELECT name, create_table_query FROM system.tables "
        "WHERE database = currentDatabase() AND engine = 'View'"
    ).rows:
        rows = store.query(f"SELECT * FROM `{name}`" + ("(version = '')" * name.endswith("_at")))
        state[name] = (definition, rows.columns, sorted(map(repr, rows.rows)))
    return state


def view_definitions(path: Path) -> dict[str, str]:
    with open_store(f"chdb://{path}", read_only=True) as store:
        return {name: definition for name, (definition, _, _) in view_state(store).items()}


@pytest.mark.slow
def test_a_store_migrated_before_views_moved_opens_and_its_views_read_as_a_fresh_stores(
    tmp_path: Path,
) -> None:
    # The same events for both stores: an event's id is new each time one is made.
    events = [[make_event(kind, i) for i in range(40)] for kind in EVENT_TYPES]
    # Every fifth rollout held out, as an orchestrator's evaluations are: the views over them.
    events = [
        [
            msgspec.structs.replace(e, info={"split": "test"})
            if isinstance(e, RolloutCompleted) and i % 5 == 0
            else e
            for i, e in enumerate(of_kind)
        ]
        for of_kind in events
    ]
    old_store(tmp_path / "old", migrations_before_views())
    before = view_definitions(tmp_path / "old")
    with open_store(f"chdb://{tmp_path / 'old'}") as store:
        assert store.migrate() == []
        fill(store, events)
        reopened = view_state(store)
    with open_store(f"chdb://{tmp_path / 'fresh'}") as store:
        fill(store, events)
        fresh = view_state(store)
    assert sorted(before) == sorted(set(fresh) - VIEWS_ADDED_SINCE)
    # The files under bus/store/views hold the SQL the old migrations' last definitions held.
    unchanged = set(before) - VIEWS_CHANGED_SINCE
    assert {name: fresh[name][0] for name in unchanged} == {n: before[n] for n in unchanged}
    assert all(fresh[name][0] != before[name] for name in VIEWS_CHANGED_SINCE)
    assert reopened == fresh
    empty = sorted(name for name, (_, _, rows) in fresh.items() if not rows)
    assert empty == ["conflicts"], "every view but conflicts should have rows to compare"


def test_each_view_is_defined_in_one_view_file_and_in_no_migration(tmp_path: Path) -> None:
    in_migrations = [
        f"{migration.name}: {statement[:60]}"
        for migration in load_migrations()
        for statement in split_statements(migration.sql)
        if words(statement)[:1] == ["CREATE"]
        and "VIEW" in words(statement)[:6]
        and "MATERIALIZED" not in words(statement)[:6]
    ]
    assert not in_migrations, (
        "plain views belong in bus/store/views (one file per view, re-applied on every "
        f"migrate), not in migrations: {in_migrations}"
    )
    with open_store(f"chdb://{tmp_path / 'data'}") as store:
        in_store = {
            name
            for (name,) in store.query(
                "SELECT name FROM system.tables "
                "WHERE database = currentDatabase() AND engine = 'View'"
            ).rows
        }
    defined = [view for view_file in load_views() for view in view_file.views]
    assert sorted(defined) == sorted(in_store)


def test_migrate_again_applies_no_migration_and_re_applies_every_view(tmp_path: Path) -> None:
    with open_store(f"chdb://{tmp_path / 'data'}") as store:
        ledger = store.query("SELECT count() FROM schema_migrations").rows
        columns = store.query("SELECT * FROM staleness").columns
        store.command("CREATE OR REPLACE VIEW `staleness` AS SELECT 1 AS `x`")
        store.command("DROP VIEW `reward_by_step`")
        assert store.migrate() == []
        assert store.query("SELECT * FROM staleness").columns == columns
        assert store.query("SELECT count() FROM reward_by_step").rows == [(0,)]
        assert store.query("SELECT count() FROM schema_migrations").rows == ledger


@pytest.mark.parametrize("applied", ["before views moved", "as now"])
@pytest.mark.slow
def test_a_rewritten_migration_that_changes_again_is_refused(tmp_path: Path, applied: str) -> None:
    migrations = migrations_before_views() if applied == "before views moved" else load_migrations()
    old_store(tmp_path / "data", migrations)
    edited = [
        Migration(m.version, m.name, m.sql + "\n-- edited") if m.version == 4 else m
        for m in load_migrations()
    ]
    client = clickhouse_connect.get_client(interface="chdb", path=str(tmp_path / "data"))
    try:
        with pytest.raises(
            MigrationError, match=r"0004_analytics_views\.sql differs .* new numbered migration"
        ):
            migrate(client, edited)
        assert migrate(client) == []
    finally:
        client.close()


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        ({"scores.sql": "SELECT 1"}, r"views/scores\.sql: name a view file DEPTH_VIEW\.sql"),
        (
            {"1_t.sql": "CREATE TABLE `t` (a Int64) ENGINE = Memory"},
            r"views/1_t\.sql, statement 1 is not CREATE OR REPLACE VIEW",
        ),
        (
            {"1_v.sql": "CREATE VIEW IF NOT EXISTS `v` AS SELECT 1"},
            r"views/1_v\.sql, statement 1 is not CREATE OR REPLACE VIEW",
        ),
        (
            {
                "1_v.sql": "CREATE OR REPLACE VIEW `v` AS SELECT 1",
                "2_w.sql": "CREATE OR REPLACE VIEW `w` AS SELECT 1;"
                "CREATE OR REPLACE VIEW `v` AS SELECT 2",
            },
            r"view v is defined in views/1_v\.sql and views/2_w\.sql",
        ),
        (
            {"1_v.sql": "CREATE OR REPLACE VIEW `w` AS SELECT 1"},
            r"views/1_v\.sql defines no view v",
        ),
    ],
)
def test_view_files_are_refused_unless_each_replaces_the_view_it_is_named_after(
    tmp_path: Path, files: dict[str, str], problem: str
) -> None:
    for name, sql in files.items():
        (tmp_path / name).write_text(sql)
    with pytest.raises(MigrationError, match=problem):
        load_views(tmp_path)


def test_view_files_apply_by_depth_then_name(tmp_path: Path) -> None:
    views = {
        "10_d.sql": "SELECT * FROM `c`",
        "2_c.sql": "SELECT * FROM `b` UNION ALL SELECT * FROM `a`",
        "1_b.sql": "SELECT 2 AS x",
        "1_a.sql": "SELECT 1 AS x",
    }
    for name, select in views.items():
        view = name.removesuffix(".sql").split("_")[1]
        (tmp_path / name).write_text(f"CREATE OR REPLACE VIEW `{view}` AS {select};\n")
    (tmp_path / "README").write_text("not a view file")
    assert [f.name for f in load_views(tmp_path)] == ["1_a.sql", "1_b.sql", "2_c.sql", "10_d.sql"]
    client = clickhouse_connect.get_client(interface="chdb", path=str(tmp_path / "data"))
    try:
        migrate(client, [], load_views(tmp_path))
        assert client.query("SELECT x FROM d ORDER BY x").result_rows == [(1,), (2,)]
    finally:
        client.close()
    # A view numbered below a view it reads: a fresh store does not have that view yet.
    (tmp_path / "1_e.sql").write_text("CREATE OR REPLACE VIEW `e` AS SELECT * FROM `d`")
    client = clickhouse_connect.get_client(interface="chdb", path=str(tmp_path / "fresh"))
    try:
        with pytest.raises(MigrationError, match=r"views/1_e\.sql, statement 1 failed: .*\bd\b"):
            migrate(client, [], load_views(tmp_path))
    finally:
        client.close()
