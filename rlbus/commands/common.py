"""What every command shares: settings from --config + env + dotted overrides, the asyncio
entry point that stops cleanly on Ctrl-C / SIGTERM, and errors as exits."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.markup import escape

from rlbus.bus.telemetry import setup_telemetry
from rlbus.config import ConfigError, Settings, load_settings
from rlbus.console import err_console
from rlbus.discovery import require_bootstrap
from rlbus.launch.collector import steady_collector

TRAIN_EXTRA = "pip install torch==2.13.0 && pip install 'rlbus[train]'"
"""torch first: the pinned CPU build; a looser requirement resolved first pulls a CUDA one."""


def require_train_extra(command: str) -> None:
    """Exit with the install line when torch or transformers is missing: evaluating, data and
    analytics commands run without them; training, serving and model commands do not."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        err_console.print(
            f"[red]{command} needs {' and '.join(missing)}[/red] (the `train` extra): "
            + escape(TRAIN_EXTRA)
        )
        raise typer.Exit(2)


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

ScorerVersionOption = Annotated[
    str,
    typer.Option(
        "--scorer-version",
        help="Scores of this scorer version (default: each rollout's newest score).",
    ),
]

ResumeOption = Annotated[
    bool,
    typer.Option("--resume", help="Continue from the last checkpoint; fails if there is none."),
]

T = TypeVar("T")
S = TypeVar("S", bound=Settings)


def fail(exc: BaseException | str, code: int = 2) -> typer.Exit:
    """Print what went wrong (the exception's message says what to do) and make the exit."""
    err_console.print(str(exc), style="red", markup=False)
    return typer.Exit(code)


@contextmanager
def exits_on(*errors: type[BaseException], code: int = 2) -> Iterator[None]:
    """Turn the named errors into a printed message and an exit with `code`."""
    try:
        yield
    except errors as exc:
        raise fail(exc, code) from exc


def settings_from(ctx: typer.Context, config: Path | None, model: type[S] = Settings) -> S:
    """Load settings or exit with the offending fields named; telemetry is set up from them
    (service `rlbus.COMMAND`, e.g. rlbus.eval, rlbus.tasks.publish, rlbus.env for a worker)."""
    with exits_on(ConfigError):
        settings = load_settings(config, list(ctx.args), model=model)
    setup_telemetry(settings.telemetry, command_name(ctx))
    return settings


def command_name(ctx: typer.Context) -> str:
    """The command's words after `rlbus` (a worker's: its role), joined with dots."""
    words = ctx.command_path.split()[1:]
    return ".".join(words[1:] if words[:1] == ["worker"] else words) or "rlbus"


def start_role(settings: S, role: str) -> S:
    """Settings of a long-lived role, with a broker found; logging and telemetry set up."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = require_bootstrap(settings)
    setup_telemetry(settings.telemetry, role)
    return settings


STOP_GRACE_S = 30.0
"""How long a role may take to stop after SIGINT/SIGTERM before it exits unfinished. A clean stop
commits what the role handled; against a broker that is gone (its launcher killed, and the
embedded broker with it) those commits never return, and the role would linger for good. What
it had not committed is handled again, as after a SIGKILL. (Kubernetes' default grace is 30 s
too.)"""


def _exit_after(grace_s: float) -> None:
    """From a thread of its own, so that a blocked event loop cannot hold the exit back."""

    def exit_unfinished() -> None:
        err_console.print(f"not stopped {grace_s:g}s after the signal: exiting unfinished")
        os._exit(1)

    timer = threading.Timer(grace_s, exit_unfinished)
    timer.daemon = True
    timer.start()


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[T]]) -> T:
    """Run `main(stop)`; SIGINT/SIGTERM set `stop` so the coroutine can finish its batch, within
    STOP_GRACE_S."""

    async def runner() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stopping() -> None:
            if not stop.is_set():
                stop.set()
                _exit_after(STOP_GRACE_S)

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping)
        return await main(stop)

    # What a long-lived role imported and built before this point lives as long as it does
    # (a sink polling thousands of records a second set off a full collection every few polls).
    with steady_collector():
        return asyncio.run(runner())
