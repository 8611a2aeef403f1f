"""`rlbus run`, `rlbus replay sft`, `rlbus worker trainer` and `rlbus worker orchestrator`."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlbus.bus import Bus
from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    console,
    err_console,
    run_until_signal,
)
from rlbus.config import ConfigError, Settings, load_settings
from rlbus.config.run import ReplayConfig, RunConfig
from rlbus.discovery import require_bootstrap
from rlbus.launcher import LocalRun

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


def _load(model: type[Settings], ctx: typer.Context, config: Path | None) -> Settings:
    try:
        settings = load_settings(config, list(ctx.args), model=model)
        if isinstance(settings, RunConfig):
            settings.check()
    except ConfigError as exc:
        err_console.print(str(exc), style="red", markup=False)
        raise typer.Exit(2) from exc
    if isinstance(settings, RunConfig) and settings.run_id == "default" and config is not None:
        # A run needs a stable id to be resumed: the config's name, unless one is given.
        settings = settings.model_copy(update={"run_id": config.stem})
    return settings


def _fail(exc: Exception) -> typer.Exit:
    err_console.print(str(exc), style="red", markup=False)
    return typer.Exit(2)


def run(ctx: typer.Context, config: ConfigArgument, resume: ResumeOption = False) -> None:
    """Train: broker, store, inference, env producers, judges, orchestrator and trainer as local
    processes, with a live dashboard. Stops at max_steps (after the final evaluation) or on Ctrl-C."""
    from rlbus.consumers.trainer.checkpoint import CheckpointStore

    cfg = _load(RunConfig, ctx, config)
    assert isinstance(cfg, RunConfig)
    checkpoints = CheckpointStore(cfg.checkpoint_url())
    if resume and not checkpoints.exists():
        err_console.print(
            f"nothing to resume: run {cfg.run_id!r} has no checkpoint under {checkpoints.url}",
            style="red",
            markup=False,
        )
        raise typer.Exit(1)
    if not resume and checkpoints.exists():
        err_console.print(
            f"run {cfg.run_id!r} has a checkpoint at step {checkpoints.latest_step()} "
            f"({checkpoints.url}): pass --resume, or set another run_id",
            style="red",
            markup=False,
        )
        raise typer.Exit(1)
    try:
        code = LocalRun(cfg, config, list(ctx.args), resume, console).run()
    except KeyboardInterrupt:
        console.print("stopped; continue with --resume")
        raise typer.Exit(130) from None
    except (RuntimeError, TimeoutError) as exc:
        raise _fail(exc) from exc
    console.print(
        f"run {cfg.run_id} finished at step {cfg.max_steps}"
        if code == 0
        else f"orchestrator exited {code}"
    )
    console.print(
        f"query it: rlbus sql \"SELECT * FROM reward_by_step WHERE run_id = '{cfg.run_id}' ORDER BY step\""
    )


def _worker_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def trainer(ctx: typer.Context, config: ConfigOption = None, resume: ResumeOption = False) -> None:
    """Trainer: consume `batches`, one optimizer step each; publish WeightVersion and TrainStep."""
    from rlbus.consumers.trainer.checkpoint import NothingToResume
    from rlbus.consumers.trainer.session import CheckpointExists, open_session
    from rlbus.consumers.trainer.worker import TrainerWorker, run_trainer

    _worker_logging()
    cfg = require_bootstrap(_load(RunConfig, ctx, config))
    assert isinstance(cfg, RunConfig)
    if cfg.trainer.parallel == "fsdp":
        import torch.distributed as dist

        # torchrun sets RANK, WORLD_SIZE and MASTER_ADDR/PORT for every rank.
        dist.init_process_group("gloo" if cfg.trainer.device == "cpu" else "nccl")
    try:
        session = open_session(cfg.trainer, cfg.model, cfg.checkpoint_url(), cfg.max_steps, resume)
    except (NothingToResume, CheckpointExists) as exc:
        raise _fail(exc) from exc
    console.print(
        f"trainer: {cfg.model} at step {session.state.step}, checkpoints {session.checkpoints.url}"
    )
    step = session.trainer.step
    if cfg.trainer.parallel == "fsdp":
        from rlbus.consumers.trainer.fsdp import Leader, follow

        if session.trainer.ranks.rank != 0:
            follow(session.trainer, session.hooks, session.checkpoints, session.state.step)
            return
        leader = Leader(session.trainer)
        step = leader.step

    async def main(stop: asyncio.Event) -> int:
        async with Bus(cfg) as bus:
            worker = TrainerWorker(
                bus,
                step,
                session.checkpoints,
                session.state,
                session.hooks,
                cfg.run_id,
                cfg.orchestrator.max_off_policy_steps,
                cfg.max_steps,
                stop,
            )
            await run_trainer(bus, worker)
        return session.state.step

    try:
        console.print(f"trainer stopped at step {run_until_signal(main)}")
    finally:
        if cfg.trainer.parallel == "fsdp":
            leader.stop()


def orchestrator(
    ctx: typer.Context, config: ConfigOption = None, resume: ResumeOption = False
) -> None:
    """Orchestrator: scored rollouts -> TrainBatches; publishes tasks with bounded work in flight.
    (It follows the trainer's announced version, so --resume needs nothing of it.)"""
    from rlbus.consumers.orchestrator.build import build_orchestrator
    from rlbus.consumers.orchestrator.worker import run_orchestrator, summary

    _worker_logging()
    cfg = require_bootstrap(_load(RunConfig, ctx, config))
    assert isinstance(cfg, RunConfig)
    base_dir = config.parent if config else Path.cwd()

    async def main(stop: asyncio.Event) -> dict:
        async with Bus(cfg) as bus:
            try:
                orch = build_orchestrator(bus, cfg, base_dir)
            except (ConfigError, KeyError, ValueError) as exc:
                raise _fail(exc) from exc
            await run_orchestrator(bus, orch, stop)
            if not orch.done.is_set():
                raise typer.Exit(3)  # stopped before max_steps: the launcher tells the two apart
            return summary(orch)

    console.print(run_until_signal(main))


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
            help="SQL condition over the `scored` table, e.g. "
            "\"reward >= 1 AND env = 'reverse_text'\"."
        ),
    ] = "reward >= 1",
    run_id: Annotated[str | None, typer.Option("--run", help="Only rollouts of this run.")] = None,
    config: ConfigOption = None,
) -> None:
    """SFT on stored rollouts: their exact token ids and loss masks from ClickHouse."""
    from rlbus.bus.store import open_store
    from rlbus.consumers.orchestrator.replay import ReplayError, stored_samples
    from rlbus.consumers.trainer.sft import train_sft

    cfg = _load(ReplayConfig, ctx, config)
    assert isinstance(cfg, ReplayConfig)
    try:
        with open_store(cfg.store.url, read_only=True) as store:
            samples = asyncio.run(stored_samples(store, where, run_id))
    except ReplayError as exc:
        raise _fail(exc) from exc
    console.print(
        f"{len(samples):,} samples ({sum(len(s.input_ids) // 4 for s in samples):,} tokens) "
        f"from {cfg.store.url}"
    )
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(
        *columns, TextColumn("loss {task.fields[loss]:.4f}"), console=console
    ) as progress:
        bar = progress.add_task("sft", total=cfg.steps, loss=float("nan"))
        train_sft(
            samples,
            model,
            out,
            cfg.trainer,
            cfg.steps,
            cfg.batch_size,
            cfg.seed,
            on_step=lambda _, result: progress.update(bar, advance=1, loss=result.loss),
        )
    console.print(f"wrote {out}")


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(run)
    app.add_typer(replay_app, name="replay")
    for command in (trainer, orchestrator):
        worker_app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(command)
