"""`rlbus ui`: the web app over the store (rlbus.ui)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlbus.bus.store import StoreError, open_store
from rlbus.commands.common import OVERRIDES, OVERRIDES_HELP, ConfigOption, exits_on, settings_from
from rlbus.console import console


def ui(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback unless you say).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one.")] = 0,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="A Hugging Face tokenizer (a directory holding tokenizer.json, or the file) to "
            "decode token ids with; else the run's model name is tried as one, else ids show."
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Browse runs, curves, rollouts, trace graphs and token strips in a local web app.

    Reads the store read-only: through the run's endpoint while a run holds it, else directly.
    """
    from rlbus.ui import serve

    settings = settings_from(ctx, config)
    with exits_on(StoreError):
        open_store(settings.store.url, read_only=True).close()

    def ready(url: str) -> None:
        console.print(f"rlbus ui: {url}", markup=False, soft_wrap=True)
        console.print(f"reading store {settings.store.url}; Ctrl-C stops", markup=False)

    serve(settings.store.url, host, port, str(tokenizer) if tokenizer else None, ready)


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(ui)
