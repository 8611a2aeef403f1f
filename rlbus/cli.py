"""The `rlbus` command: assembled from rlbus.commands.*, one module per area, each with
`register(app, worker_app)`."""

from __future__ import annotations

import atexit
import gc

import typer

from rlbus.commands import (
    asyncapi,
    broker,
    config,
    engine,
    env,
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

# The interpreter's last full collection frees nothing a process about to exit needs, and over a
# heap holding torch it takes 0.75 s (seconds under load): a stopped run waited on it for the
# launcher and for each role. Registered first, so it runs after every other exit handler.
atexit.register(gc.freeze)

app = typer.Typer(
    name="rlbus",
    help="Event-sourced post-training: environments, evals, SFT, RL and distillation over one "
    "event log.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    # Docstrings are wrapped at 100 columns in the source; markdown joins their lines again.
    rich_markup_mode="markdown",
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
    engine,
    env,
    broker,
    config,
    worker,
    ui,
    asyncapi,
):
    module.register(app, worker_app)


JOBS: dict[str, tuple[str, str]] = {
    "quickstart": ("Start here", "rlbus quickstart"),
    "tasks": ("Data", "rlbus tasks publish reasoning-gym:chain_sum --env chain_sum --limit 256"),
    "export": ("Data", "rlbus export --run RUN --format jsonl --out rollouts.jsonl"),
    "eval": ("Evaluate", "rlbus eval examples/reverse_text --model M --base-url URL -n 64"),
    "rescore": ("Evaluate", "rlbus rescore examples/reverse_text --run RUN"),
    "run": ("Train", "rlbus run examples/reverse_text/rl.toml --model DIR"),
    "replay": ("Train", "rlbus replay sft --model DIR --out OUT --where 'reward >= 1'"),
    "model": ("Train", "rlbus model init models/tiny --arch llama --size tiny"),
    "ui": ("Look", "rlbus ui --port 8765"),
    "sql": ("Look", 'rlbus sql "SELECT env, count() FROM rollouts GROUP BY env"'),
    "report": ("Look", "rlbus report RUN --out report/"),
    "engine": ("Operate", "rlbus engine install vllm"),
    "env": ("Operate", "rlbus env install ./my_env"),
    "worker": ("Operate", "rlbus worker sink"),
    "broker": ("Operate", "rlbus broker"),
    "topics": ("Operate", "rlbus topics"),
    "config": ("Operate", "rlbus config --config run.toml"),
    "asyncapi": ("Operate", "rlbus asyncapi --out asyncapi.json"),
}
"""`rlbus --help` groups commands by job, and each command's help ends with an example."""


PANELS = ["Start here", "Data", "Evaluate", "Train", "Look", "Operate"]


def _name(info: typer.models.CommandInfo | typer.models.TyperInfo) -> str:
    return info.name or (info.callback.__name__ if info.callback else "")


def _by_job() -> None:
    # Panels show in the order of their first command: sort commands by job, then groups.
    app.registered_commands.sort(key=lambda info: PANELS.index(JOBS[_name(info)][0]))
    for info in [*app.registered_commands, *app.registered_groups]:
        job, example = JOBS[_name(info)]
        info.rich_help_panel = job
        info.epilog = f"Example: `{example}`" + (f"\n\n{info.epilog}" if info.epilog else "")


_by_job()
