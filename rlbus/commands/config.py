"""`rlbus config`: every setting with its value and its help, after file, env and overrides."""

from __future__ import annotations

from typing import Any

import typer
from pydantic import BaseModel
from rich.markup import escape
from rich.table import Table

from rlbus.commands.common import OVERRIDES, OVERRIDES_HELP, ConfigOption, settings_from
from rlbus.console import console


def rows(model: BaseModel, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted name, value, docstring) for every leaf field."""
    out: list[tuple[str, Any, str]] = []
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        dotted = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            out.extend(rows(value, dotted + "."))
        else:
            out.append((dotted, value, info.description or ""))
    return out


def config(ctx: typer.Context, config: ConfigOption = None) -> None:
    """Show the effective settings (validated: a bad field fails here, named)."""
    settings = settings_from(ctx, config)
    table = Table(title="rlbus settings (override with --name VALUE, '_' may be '-')")
    table.add_column("name")
    table.add_column("value")
    table.add_column("help")
    for name, value, doc in rows(settings):
        table.add_row(escape(name), escape(repr(value)), escape(doc))
    console.print(table)


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(config)
