"""`rlbus tasks publish`: tasks from files, saved data sets or Python onto the `tasks` topic."""

from __future__ import annotations

import asyncio
from itertools import islice
from typing import Annotated

import typer

from rlbus.bus.telemetry import setup_telemetry
from rlbus.commands.common import OVERRIDES, OVERRIDES_HELP, ConfigOption, exits_on, settings_from
from rlbus.console import console, progress
from rlbus.discovery import require_bootstrap
from rlbus.producers.tasksets import TaskSourceError, load_tasks
from rlbus.producers.tasksets.publish import publish_tasks

tasks_app = typer.Typer(help="Publish tasks for environments.", no_args_is_help=True)


@tasks_app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def publish(
    ctx: typer.Context,
    source: Annotated[
        str,
        typer.Argument(
            help="FILE.jsonl | FILE.parquet | HF dataset dir | FILE.py:NAME | module:NAME"
        ),
    ],
    env: Annotated[
        str | None, typer.Option(help="Environment id for rows that have no `env` column.")
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run the tasks belong to.")] = None,
    limit: Annotated[int | None, typer.Option(help="Publish at most this many tasks.")] = None,
    config: ConfigOption = None,
) -> None:
    """Publish tasks to the `tasks` topic, with a progress bar."""
    settings = require_bootstrap(settings_from(ctx, config))
    setup_telemetry(settings.telemetry, "tasks")
    run = run_id or settings.run_id
    with exits_on(TaskSourceError, OSError):
        tasks = list(islice(load_tasks(source, env=env, run_id=run), limit))
    with progress() as bars:
        bar = bars.add_task("publishing", total=len(tasks))
        n = asyncio.run(publish_tasks(settings, tasks, lambda k: bars.update(bar, advance=k)))
    console.print(f"published {n:,} tasks to {settings.kafka.topic_prefix}tasks (run {run!r})")


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
