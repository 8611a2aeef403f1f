"""`rlbus sql`: read-only SQL over the store, as a table, CSV or JSON."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated

import typer
from rich.table import Table

from rlbus.bus.store import StoreError, open_store
from rlbus.commands.common import OVERRIDES, OVERRIDES_HELP, ConfigOption, settings_from
from rlbus.console import console, err_console


class Format(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


CLICKHOUSE_FORMAT = {Format.csv: "CSVWithNames", Format.json: "JSONEachRow"}


def sql(
    ctx: typer.Context,
    query: Annotated[
        str, typer.Argument(help="A read-only statement: SELECT, WITH, SHOW, DESCRIBE, EXPLAIN.")
    ],
    fmt: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    config: ConfigOption = None,
) -> None:
    """Run read-only SQL over the store and print the result.

    Works while a run holds the embedded chdb store (through its loopback endpoint) and
    when nothing does (opening the directory directly).
    """
    settings = settings_from(ctx, config)
    try:
        with open_store(settings.store.url, read_only=True) as store:
            if fmt is not Format.table:
                sys.stdout.buffer.write(store.query_raw(query, CLICKHOUSE_FORMAT[fmt]))
                return
            result = store.query(query)
    except StoreError as exc:
        err_console.print(str(exc), style="red", markup=False)
        raise typer.Exit(2) from exc
    except Exception as exc:  # the engine's own message (syntax, unknown column) is the useful part
        err_console.print(f"query failed: {exc}", style="red", markup=False)
        raise typer.Exit(1) from exc
    table = Table(*result.columns, caption=f"{len(result.rows):,} rows")
    for row in result.rows:
        table.add_row(*(str(v) for v in row))
    console.print(table)


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(sql)
