"""`rlbus run` (every role of a run as local processes, with a live dashboard) and
`rlbus replay sft` (SFT on stored rollouts)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import TextColumn

from rlbus.bus.telemetry import setup_telemetry
from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    ScorerVersionOption,
    exits_on,
    fail,
    settings_from,
)
from rlbus.config import ConfigError
from rlbus.config.run import ReplayConfig, load_run_config
from rlbus.console import console, progress
from rlbus.launch.supervisor import BrokerLost, LocalRun

replay_app = typer.Typer(
    help="Train on stored rollouts (exact stored token ids, never re-rendered text).",
    no_args_is_help=True,
)

ConfigArgument = Annotated[
    Path, typer.Argument(metavar="CONFIG", help="Run config (TOML).", exists=True, dir_okay=False)
]
ResumeOption = Annotated[
    bool,
    typer.Option("--resume", help="Continue from the last checkpoint; fails if there is none."),
]


def run(ctx: typer.Context, config: ConfigArgument, resume: ResumeOption = False) -> None:
    """Train: broker, store, inference, env producers, judges, orchestrator and trainer as local
    processes, with a live dashboard. Stops at max_steps (after the final evaluation) or on
    Ctrl-C."""
    from rlbus.consumers.trainer.checkpoint import CheckpointStore

    with exits_on(ConfigError):
        cfg = load_run_config(config, list(ctx.args))
    setup_telemetry(cfg.telemetry, "run")
    checkpoints = CheckpointStore(cfg.checkpoint_url())
    if resume and not checkpoints.exists():
        raise fail(
            f"nothing to resume: run {cfg.run_id!r} has no checkpoint under {checkpoints.url}", 1
        )
    if not resume and checkpoints.exists():
        raise fail(
            f"run {cfg.run_id!r} has a checkpoint at step {checkpoints.latest_step()} "
            f"({checkpoints.url}): pass --resume, or set another run_id",
            1,
        )
    local = LocalRun(cfg, config, list(ctx.args), resume, console)
    try:
        code = local.run()
    except KeyboardInterrupt:
        console.print("stopped; continue with --resume")
        raise typer.Exit(130) from None
    except BrokerLost as exc:
        lost = local.unstored()
        what = ", ".join(f"{n:,} on {topic}" for topic, n in lost.items()) or "nothing"
        raise fail(
            f"{exc}: run {cfg.run_id} stopped. Acknowledged by the broker but not in the store: "
            f"{what} ({sum(lost.values()):,} events, lost with it); everything else is in "
            f"{cfg.store.url}. Continue with: rlbus run {config} --resume",
            1,
        ) from exc
    except (RuntimeError, TimeoutError) as exc:
        raise fail(exc) from exc
    done = f"run {cfg.run_id} finished at step {cfg.max_steps}"
    console.print(done if code == 0 else f"orchestrator exited {code}")
    query = f"SELECT * FROM reward_by_step WHERE run_id = '{cfg.run_id}' ORDER BY step"
    console.print(f'query it: rlbus sql "{query}"')


@replay_app.command("sft", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def replay_sft(
    ctx: typer.Context,
    model: Annotated[
        Path, typer.Option("--model", help="Model directory to start from.", exists=True)
    ],
    out: Annotated[Path, typer.Option("--out", help="Directory to write the trained model to.")],
    where: Annotated[
        str,
        typer.Option(
            help="SQL condition over the `scored` table's columns, e.g. "
            "\"reward >= 1 AND env = 'reverse_text'\"."
        ),
    ] = "reward >= 1",
    run_id: Annotated[str | None, typer.Option("--run", help="Only rollouts of this run.")] = None,
    scorer_version: ScorerVersionOption = "",
    config: ConfigOption = None,
) -> None:
    """SFT on stored rollouts: their exact token ids and loss masks from ClickHouse. Its batches,
    steps and weight versions go to the bus as a run's do (run id: --run-id, default
    replay-sft-TIME)."""
    from rlbus.consumers.orchestrator.replay import ReplayError
    from rlbus.launch.replay import ReplayRunError, Selection, read_samples
    from rlbus.launch.replay import replay_sft as replay

    cfg = settings_from(ctx, config, ReplayConfig)
    selection = Selection(where, run_id, scorer_version)
    with exits_on(ReplayError):
        stored = read_samples(cfg, selection)
    tokens = sum(len(s.input_ids) // 4 for s in stored.samples)
    skipped = (
        f"; {stored.without_tokens:,} rollouts without token ids left out"
        if stored.without_tokens
        else ""
    )
    console.print(
        f"{len(stored.samples):,} samples ({tokens:,} tokens) from {stored.rollouts:,} rollouts "
        f"in {cfg.store.url}{skipped}"
    )
    with (
        exits_on(ReplayRunError, TimeoutError, RuntimeError),
        progress(TextColumn("loss {task.fields[loss]:.4f}")) as bars,
    ):
        bar = bars.add_task("sft", total=cfg.steps, loss=float("nan"))
        result = replay(
            cfg,
            selection,
            model,
            out,
            stored,
            on_step=lambda _, step: bars.update(bar, advance=1, loss=step.loss),
        )
    console.print(f"wrote {out}; run {result.run_id} holds its steps")
    query = (
        f"SELECT step, loss FROM train_steps FINAL WHERE run_id = '{result.run_id}' ORDER BY step"
    )
    console.print(f'query it: rlbus sql "{query}"; rlbus report {result.run_id}')


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(run)
    app.add_typer(replay_app, name="replay")
