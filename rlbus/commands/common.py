"""What every command shares: settings from --config + env + dotted overrides, and the
asyncio entry point that stops cleanly on Ctrl-C / SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console

from rlbus.config import ConfigError, Settings, load_settings

console = Console()
err_console = Console(stderr=True)

OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}
"""Context settings for commands that take `--section.field VALUE` overrides."""

OVERRIDES_HELP = "Any setting can follow as --section.field VALUE (see `rlbus config`)."

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-C",
        help="TOML config file; env vars and --section.field overrides win over it.",
        exists=True,
        dir_okay=False,
    ),
]

T = TypeVar("T")


def settings_from(
    ctx: typer.Context, config: Path | None, model: type[Settings] = Settings
) -> Settings:
    """Load settings or exit with the offending fields named."""
    try:
        return load_settings(config, list(ctx.args), model=model)
    except ConfigError as exc:
        err_console.print(str(exc), style="red", markup=False)
        raise typer.Exit(2) from exc


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[T]]) -> T:
    """Run `main(stop)`; SIGINT/SIGTERM set `stop` so the coroutine can finish its batch."""

    async def runner() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await main(stop)

    return asyncio.run(runner())
