"""The `rlbus` command: assembled from rlbus.commands.*, one module per area."""

from __future__ import annotations

import typer

from rlbus.commands import broker, config_cmd, quickstart, store_cmds, tasks, workers

app = typer.Typer(
    name="rlbus",
    help="Event-sourced post-training: environments, evals, SFT, RL and distillation over one event log.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
worker_app = typer.Typer(help="Run one role as a long-lived process (a Kafka consumer group member).",
                         no_args_is_help=True)
app.add_typer(worker_app, name="worker")

for module in (quickstart, tasks, store_cmds, broker, config_cmd):
    module.register(app)
workers.register(worker_app)
