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
from rich.table import Table

from rlbus.bus.store import open_store
from rlbus.commands.common import OVERRIDES, OVERRIDES_HELP, ConfigOption, settings_from
from rlbus.config import data_dir
from rlbus.console import console, progress
from rlbus.discovery import local_broker
from rlbus.launch.local_sink import local_sink
from rlbus.producers.task_sources.generated import reverse_text
from rlbus.producers.task_sources.publish import publish_tasks

LANDED = "SELECT count() FROM tasks FINAL WHERE run_id = {run:String}"
SUMMARY = (
    "SELECT env, count() AS tasks, uniqExact(task_id) AS distinct_ids, "
    "round(avg(length(answer)), 2) AS mean_answer_len, max(ingested_at) - min(ts) AS lag_s "
    "FROM tasks FINAL WHERE run_id = {run:String} GROUP BY env"
)
SAMPLE = (
    "SELECT task_id, JSONExtractString(prompt, 1, 'content') AS prompt, answer "
    "FROM tasks FINAL WHERE run_id = {run:String} ORDER BY task_id LIMIT 5"
)


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
    p = {"run": run_id}
    with local_broker(settings) as (live, _):
        console.print(
            f"broker: {live.kafka.bootstrap_servers}   store: {live.store.url}   logs: {logs}"
        )
        with local_sink(live, timeout_s) as sink:
            with progress() as bars:
                published = bars.add_task("publishing", total=n)
                tasks = reverse_text(n, seed=0)
                advance = lambda k: bars.update(published, advance=k)  # noqa: E731
                asyncio.run(publish_tasks(live, tasks, advance))
                landed = bars.add_task("in ClickHouse", total=n)
                count = lambda c: bars.update(landed, completed=c)  # noqa: E731
                sink.wait_landed(LANDED, p, n, f"{n} tasks in the store", timeout_s, count)
            with open_store(live.store.url, read_only=True) as store:
                summary = store.query(SUMMARY, p)
                sample = store.query(SAMPLE, p)
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
