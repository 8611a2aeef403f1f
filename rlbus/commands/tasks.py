"""`rlbus tasks publish`: tasks from files, standard input, Hugging Face datasets or Python onto
the `tasks` topic."""

from __future__ import annotations

import asyncio
import logging
from itertools import islice
from typing import Annotated

import typer

from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    exits_on,
    fail,
    settings_from,
)
from rlbus.console import console, progress
from rlbus.discovery import require_bootstrap
from rlbus.environment.task_sources import TaskSourceError, load_tasks
from rlbus.environment.task_sources.publish import publish_tasks
from rlbus.launch.collector import steady_collector

tasks_app = typer.Typer(help="Publish tasks for environments.", no_args_is_help=True)


def _columns(pairs: list[str]) -> dict[str, str]:
    columns = {}
    for pair in pairs:
        source, sep, target = pair.partition("=")
        if not (sep and source and target):
            raise fail(f"--map {pair!r}: give COLUMN=FIELD, e.g. --map question=prompt")
        columns[source] = target
    return columns


def _quiet_hub() -> None:
    """One line when a hub dataset cannot be had, not a retry warning per attempt."""
    for name in ("huggingface_hub", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)


@tasks_app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def publish(
    ctx: typer.Context,
    source: Annotated[
        str,
        typer.Argument(
            help="FILE.jsonl | - (JSONL on stdin) | FILE.parquet | hf:ORG/NAME | HF dataset dir "
            "| reasoning-gym:NAME | FILE.py:NAME | module:NAME"
        ),
    ],
    env: Annotated[
        str | None, typer.Option(help="Environment id for rows that have no `env` column.")
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run the tasks belong to.")] = None,
    limit: Annotated[int | None, typer.Option(help="Publish at most this many tasks.")] = None,
    subset: Annotated[
        str | None,
        typer.Option(help="hf:ORG/NAME: the dataset's config (its subset on the Hub)."),
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(help="Hugging Face datasets: the split (train, test, train[:100], ...)."),
    ] = None,
    columns: Annotated[
        list[str] | None,
        typer.Option(
            "--map",
            help="Rename a column before it is read, COLUMN=FIELD (e.g. problem=prompt, "
            "solution=answer); repeatable. Unmapped columns other than task fields go to info.",
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Publish tasks to the `tasks` topic, with a progress bar."""
    settings = require_bootstrap(settings_from(ctx, config))
    run = run_id or settings.run_id
    _quiet_hub()
    renames = _columns(columns or [])
    with exits_on(TaskSourceError, OSError):
        found = load_tasks(source, env, run, columns=renames, subset=subset, split=split)
        tasks = list(islice(found, limit))
    with progress() as bars, steady_collector():
        bar = bars.add_task("publishing", total=len(tasks))
        n = asyncio.run(publish_tasks(settings, tasks, lambda k: bars.update(bar, advance=k)))
    console.print(f"published {n:,} tasks to {settings.kafka.topic_prefix}tasks (run {run!r})")


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
