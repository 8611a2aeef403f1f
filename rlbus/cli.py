"""The `rlbus` command: assembled from rlbus.commands.*, one module per area, each with
`register(app, worker_app)`."""

from __future__ import annotations

import typer

from rlbus.commands import (
    asyncapi,
    broker,
    config,
    eval,
    export,
    model,
    quickstart,
    replay,
    report,
    rescore,
    run,
    sql,
    tasks,
    ui,
    worker,
)

app = typer.Typer(
    name="rlbus",
    help="Event-sourced post-training: environments, evals, SFT, RL and distillation over one "
    "event log.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
worker_app = typer.Typer(
    help="Run one role as a long-lived process (a Kafka consumer group member).",
    no_args_is_help=True,
)
app.add_typer(worker_app, name="worker")

for module in (
    quickstart,
    eval,
    run,
    replay,
    tasks,
    sql,
    rescore,
    export,
    report,
    model,
    broker,
    config,
    worker,
    ui,
    asyncapi,
):
    module.register(app, worker_app)
