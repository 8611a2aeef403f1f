"""`rlbus tasks publish`: tasks from files, saved data sets or Python onto the `tasks` topic."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from itertools import islice
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlbus.bus import Bus
from rlbus.bus.telemetry import setup_telemetry
from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    console,
    err_console,
    settings_from,
)
from rlbus.config import Settings
from rlbus.discovery import require_bootstrap
from rlbus.producers.tasksets import TaskSourceError, load_tasks
from rlbus.schemas import TaskPublished

tasks_app = typer.Typer(help="Publish tasks for environments.", no_args_is_help=True)

CHUNK = 1000


async def publish_tasks(
    settings: Settings,
    tasks: Iterable[TaskPublished],
    total: int | None = None,
    progress: Progress | None = None,
) -> int:
    """Publish tasks in chunks (each chunk acknowledged before the next); returns the count."""
    count = 0
    task_bar = progress.add_task("publishing", total=total) if progress else None
    async with Bus(settings) as bus:
        iterator = iter(tasks)
        while chunk := list(islice(iterator, CHUNK)):
            await bus.publish_many(chunk)
            count += len(chunk)
            if progress is not None and task_bar is not None:
                progress.update(task_bar, advance=len(chunk))
    return count


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
    try:
        tasks = list(islice(load_tasks(source, env=env, run_id=run), limit))
    except (TaskSourceError, OSError) as exc:
        err_console.print(str(exc), style="red", markup=False)
        raise typer.Exit(2) from exc
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        n = asyncio.run(publish_tasks(settings, tasks, len(tasks), progress))
    console.print(f"published {n:,} tasks to {settings.kafka.topic_prefix}tasks (run {run!r})")


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
