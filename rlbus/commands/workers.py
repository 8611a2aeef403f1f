"""`rlbus worker ROLE`: one role as a long-lived consumer-group member."""

from __future__ import annotations

import asyncio

import typer

from rlbus.bus.store import open_store
from rlbus.bus.telemetry import setup_telemetry
from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    console,
    run_until_signal,
    settings_from,
)
from rlbus.consumers.sink import run_sink
from rlbus.discovery import require_bootstrap


def sink(ctx: typer.Context, config: ConfigOption = None) -> None:
    """Consume every topic into ClickHouse; serve read-only SQL to other processes meanwhile."""
    settings = require_bootstrap(settings_from(ctx, config))
    setup_telemetry(settings.telemetry, "sink")
    with open_store(settings.store.url, dedup_window=settings.store.dedup_window) as store:
        if settings.store.serve_http and store.data_dir is not None:
            endpoint = store.serve(settings.store.http_host)
            console.print(f"read-only SQL endpoint: {endpoint.url}")
        console.print(f"sink: {settings.kafka.bootstrap_servers} -> {settings.store.url}")

        async def main(stop: asyncio.Event) -> int:
            return (await run_sink(settings, store, stop)).rows_written

        rows = run_until_signal(main)
    console.print(f"sink stopped after writing {rows:,} rows")


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    worker_app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(sink)
