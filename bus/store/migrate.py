"""Applies the numbered .sql files in bus/store/migrations in order, once each.

Applied migrations are recorded with a checksum in `schema_migrations`; running again is a
no-op. A migration that fails half-way is not recorded and is re-run whole next time, so its
statements must be re-runnable (CREATE ... IF NOT EXISTS, ADD COLUMN IF NOT EXISTS).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable

from clickhouse_connect.driver.client import Client

from rlbus.bus.store.sqltext import split_statements

MIGRATIONS_DIR: Traversable = files("rlbus.bus.store") / "migrations"
_NAME = re.compile(r"(\d{4})_\w+\.sql")
_LEDGER = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (version UInt32, name String, checksum String, "
    "applied_at DateTime64(6, 'UTC') DEFAULT now64(6)) ENGINE = ReplacingMergeTree ORDER BY version"
)


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


def migrate(client: Client, migrations: list[Migration] | None = None) -> list[str]:
    """Apply the migrations not yet recorded; returns the names applied now."""
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
            if checksum != migration.checksum:
                raise MigrationError(
                    f"migration {migration.name} differs from {name}, applied to this store "
                    "earlier; "
                    "applied migrations must not change: put the change in a new numbered migration"
                )
            continue
        for number, statement in enumerate(split_statements(migration.sql), 1):
            try:
                client.command(statement)
            except Exception as exc:
                raise MigrationError(f"{migration.name}, statement {number} failed: {exc}") from exc
        client.insert(
            "schema_migrations",
            [[migration.version, migration.name, migration.checksum]],
            column_names=["version", "name", "checksum"],
        )
        done.append(migration.name)
    return done
