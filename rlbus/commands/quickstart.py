"""`rlbus quickstart`: the whole event log on one machine, nothing to start by hand.

Starts the embedded broker (unless one is configured), a sink process holding the store,
publishes a generated sample task set, waits until every task is in ClickHouse, and prints
what landed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlbus.bus.store import open_store
from rlbus.commands.common import OVERRIDES, OVERRIDES_HELP, ConfigOption, console, settings_from
from rlbus.commands.tasks import publish_tasks
from rlbus.config import data_dir
from rlbus.discovery import local_broker, store_served_elsewhere
from rlbus.processes import RoleProcess, wait_for
from rlbus.producers.tasksets.generated import reverse_text


def _count(url: str, run_id: str) -> int:
    with open_store(url, read_only=True) as store:
        rows = store.query(
            "SELECT count() FROM tasks FINAL WHERE run_id = {run:String}", {"run": run_id}
        ).rows
        return int(rows[0][0])


def quickstart(
    ctx: typer.Context,
    n: Annotated[int, typer.Option("-n", help="Sample tasks to publish.")] = 256,
    timeout_s: Annotated[
        float, typer.Option(help="Give up waiting for the store after this long.")
    ] = 120,
    config: ConfigOption = None,
) -> None:
    """Broker + store + sink on embedded defaults; publish sample tasks; show what landed."""
    settings = settings_from(ctx, config)
    run_id = f"quickstart-{int(time.time())}" if settings.run_id == "default" else settings.run_id
    settings = settings.model_copy(update={"run_id": run_id})
    logs = data_dir(settings) / "logs"
    with local_broker(settings) as live:
        console.print(
            f"broker: {live.kafka.bootstrap_servers}   store: {live.store.url}   logs: {logs}"
        )
        sink = RoleProcess("sink", live, logs)
        try:
            wait_for(
                lambda: store_served_elsewhere(live),
                timeout_s,
                "the sink to serve the store",
                processes=(sink,),
            )
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            with Progress(*columns, console=console) as progress:
                asyncio.run(publish_tasks(live, reverse_text(n, seed=0), n, progress))
                landed = progress.add_task("in ClickHouse", total=n)

                def all_landed() -> bool:
                    count = _count(live.store.url, run_id)
                    progress.update(landed, completed=count)
                    return count >= n

                wait_for(all_landed, timeout_s, f"{n} tasks in the store", processes=(sink,))
            with open_store(live.store.url, read_only=True) as store:
                summary = store.query(
                    "SELECT env, count() AS tasks, uniqExact(task_id) AS distinct_ids, "
                    "round(avg(length(answer)), 2) AS mean_answer_len, max(ingested_at) - min(ts) AS lag_s "
                    "FROM tasks FINAL WHERE run_id = {run:String} GROUP BY env",
                    {"run": run_id},
                )
                sample = store.query(
                    "SELECT task_id, JSONExtractString(prompt, 1, 'content') AS prompt, answer "
                    "FROM tasks FINAL WHERE run_id = {run:String} ORDER BY task_id LIMIT 5",
                    {"run": run_id},
                )
        finally:
            sink.stop()
    for title, result in (
        (f"landed in ClickHouse (run {run_id})", summary),
        ("a few of them", sample),
    ):
        table = Table(*result.columns, title=title)
        for row in result.rows:
            table.add_row(*(str(v) for v in row))
        console.print(table)
    console.print(f"next: rlbus sql \"SELECT count() FROM tasks FINAL WHERE run_id = '{run_id}'\"")


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(quickstart)
