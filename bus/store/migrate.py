"""Applies the numbered .sql files in bus/store/migrations in order, once each, then every view
in bus/store/views.

Applied migrations are recorded with a checksum in `schema_migrations`; running again applies
no migration. A migration that fails half-way is not recorded and is re-run whole next time, so
its statements must be re-runnable (CREATE ... IF NOT EXISTS, ADD COLUMN IF NOT EXISTS).
Migrations hold what has state: tables, columns, materialized views that write TO a table.

Views hold no state, so each is defined once, in its file under bus/store/views, and re-applied
(CREATE OR REPLACE VIEW) on every migrate: a view's current SQL is its file, and changing a view
is editing that file, with no migration.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable

from clickhouse_connect.driver.client import Client

from rlbus.bus.store.sqltext import Tok, split_statements, sql_tokens

MIGRATIONS_DIR: Traversable = files("rlbus.bus.store") / "migrations"
VIEWS_DIR: Traversable = files("rlbus.bus.store") / "views"
_NAME = re.compile(r"(\d{4})_\w+\.sql")
# A view file's number is its depth: 1 reads tables only, N reads views of files numbered below
# N (and views earlier in its own file, e.g. reward_by_step reads reward_by_step_at). Files apply
# by number, then name. ClickHouse refuses a view over a view that does not exist yet, so the
# order matters; a number in the name fixes it from the listing alone, where a dependency list
# would be a second place to edit and reading dependencies out of the SQL a parser to trust.
_VIEW_FILE = re.compile(r"(\d+)_(\w+)\.sql")
_LEDGER = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (version UInt32, name String, checksum String, "
    "applied_at DateTime64(6, 'UTC') DEFAULT now64(6)) ENGINE = ReplacingMergeTree ORDER BY version"
)

_REWRITTEN: dict[int, tuple[str, frozenset[str]]] = {
    2: (
        "b5dbd11e1736d6bea9581371d3cfc90b7f70ef893aa97aacfffb80f189d29d79",
        frozenset({"fd486b249c3e151be0008a9550316d51567f9673dd9ac5d385350a64b16081bd"}),
    ),
    4: (
        "4c87f4538247162144eb7d73a9c93ed1430ea2fa59e43b68e2e0c47f82d6b2bd",
        frozenset({"d32aa85d354c189fd7268e1ae5c40a89bebe36b3f0c467b3f7cf26872cfe18d9"}),
    ),
    5: (
        "3290461b365f204b94585f9d33d5b836d16bd1391ae0e9df3534a930b9e3b5dc",
        frozenset({"d5692c704ca38ab522ccd43585f3186d15c3117c1d8c5d5597dd1a164760831c"}),
    ),
    6: (
        "900571ad1862837a0db802b8e961ffbfa46308766aabffdcc44384393cc0ea08",
        frozenset({"18c13905200eac0bda0ac29da5fef301e77eb694a65edd8ece4170e43e156725"}),
    ),
}
"""Migrations rewritten after stores applied them: version -> (the file's checksum now, the
checksums of the texts it replaced). Stores record the checksum of the text they applied, and a
store that applied a replaced text must keep opening. Only the file exactly as rewritten stands
in for them, so any further edit is refused like any other.

0002, 0004, 0005 and 0006 created views; their views moved to bus/store/views (each defined
once), leaving the tables. A store migrated by the old texts ends up the same once the views
are re-applied (tests/store/test_store_views.py migrates one from
tests/store/migrations_before_views)."""


class MigrationError(RuntimeError):
    """A migration set that cannot be applied as it stands; says which file and why."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    def accepts(self, recorded: str) -> bool:
        """Whether a store that recorded checksum `recorded` for this version applied this text
        (or one this text was rewritten from)."""
        if recorded == self.checksum:
            return True
        now, replaced = _REWRITTEN.get(self.version, ("", frozenset()))
        return now == self.checksum and recorded in replaced


@dataclass(frozen=True)
class ViewFile:
    """A file of bus/store/views: the view it is named after (and the views it alone reads)."""

    name: str
    statements: tuple[str, ...]
    views: tuple[str, ...]
    """The view each statement defines, in order."""


def load_migrations(directory: Traversable = MIGRATIONS_DIR) -> list[Migration]:
    """Every NNNN_name.sql in `directory`, by version; other files are ignored."""
    found: dict[int, Migration] = {}
    for entry in directory.iterdir():
        match = _NAME.fullmatch(entry.name)
        if not match:
            continue
        version = int(match.group(1))
        if version in found:
            raise MigrationError(
                f"two migrations numbered {version:04d}: {found[version].name} and {entry.name}"
            )
        found[version] = Migration(version, entry.name, entry.read_text())
    return [found[v] for v in sorted(found)]


def _view_name(statement: str) -> str | None:
    """The view a CREATE OR REPLACE VIEW statement defines; None for any other statement."""
    lead = [statement[s:e] for kind, s, e in sql_tokens(statement) if kind is not Tok.COMMENT][:5]
    if len(lead) < 5 or [w.upper() for w in lead[:4]] != ["CREATE", "OR", "REPLACE", "VIEW"]:
        return None
    return lead[4].strip("`")


def load_views(directory: Traversable = VIEWS_DIR) -> list[ViewFile]:
    """Every N_name.sql in `directory`, in the order they apply (see _VIEW_FILE)."""
    found: list[tuple[int, str, Traversable, re.Match[str]]] = []
    for entry in directory.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _VIEW_FILE.fullmatch(entry.name)
        if not match:
            raise MigrationError(
                f"views/{entry.name}: name a view file DEPTH_VIEW.sql (e.g. 1_{entry.name}), "
                "DEPTH 1 for a view over tables only, one more than the views it reads otherwise"
            )
        found.append((int(match.group(1)), entry.name, entry, match))
    loaded: list[ViewFile] = []
    defined: dict[str, str] = {}
    for _, _, entry, match in sorted(found, key=lambda f: f[:2]):
        statements = tuple(split_statements(entry.read_text()))
        views: list[str] = []
        for number, statement in enumerate(statements, 1):
            view = _view_name(statement)
            if view is None:
                raise MigrationError(
                    f"views/{entry.name}, statement {number} is not CREATE OR REPLACE VIEW: "
                    "views re-apply on every migrate, so each must replace itself; tables and "
                    "materialized views belong in a numbered migration"
                )
            if view in defined:
                raise MigrationError(
                    f"view {view} is defined in views/{defined[view]} and views/{entry.name}; "
                    "define it once"
                )
            defined[view] = entry.name
            views.append(view)
        if defined.get(match.group(2)) != entry.name:
            raise MigrationError(
                f"views/{entry.name} defines no view {match.group(2)}; name the file after "
                "the view it holds"
            )
        loaded.append(ViewFile(entry.name, statements, tuple(views)))
    return loaded


def migrate(
    client: Client,
    migrations: list[Migration] | None = None,
    views: list[ViewFile] | None = None,
) -> list[str]:
    """Apply the migrations not yet recorded, then every view; returns the migrations' names
    applied now (views apply on every call and are not listed)."""
    client.command(_LEDGER)
    applied = {
        version: (name, checksum)
        for version, name, checksum in client.query(
            "SELECT version, name, checksum FROM schema_migrations FINAL"
        ).result_rows
    }
    done: list[str] = []
    for migration in load_migrations() if migrations is None else migrations:
        if migration.version in applied:
            name, checksum = applied[migration.version]
            if not migration.accepts(checksum):
                raise MigrationError(
                    f"migration {migration.name} differs from {name}, applied to this store "
                    "earlier; "
                    "applied migrations must not change: put the change in a new numbered migration"
                )
            continue
        _run(client, migration.name, split_statements(migration.sql))
        client.insert(
            "schema_migrations",
            [[migration.version, migration.name, migration.checksum]],
            column_names=["version", "name", "checksum"],
        )
        done.append(migration.name)
    for view_file in load_views() if views is None else views:
        _run(client, f"views/{view_file.name}", view_file.statements)
    return done


def _run(client: Client, source: str, statements: Iterable[str]) -> None:
    for number, statement in enumerate(statements, 1):
        try:
            client.command(statement)
        except Exception as exc:
            raise MigrationError(f"{source}, statement {number} failed: {exc}") from exc
