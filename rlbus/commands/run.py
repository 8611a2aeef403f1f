"""`rlbus run`: every role of a run as local processes, with a live dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlbus.bus.telemetry import setup_telemetry
from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ResumeOption,
    exits_on,
    fail,
    require_train_extra,
)
from rlbus.config import ConfigError
from rlbus.config.runs import load_run_config
from rlbus.console import console
from rlbus.launch.supervisor import BrokerLost, LocalRun
from rlbus.launch.teachers import TeacherError

ConfigArgument = Annotated[
    Path, typer.Argument(metavar="CONFIG", help="Run config (TOML).", exists=True, dir_okay=False)
]


def run_command(ctx: typer.Context, config: ConfigArgument, resume: ResumeOption = False) -> None:
    """Train: broker, store, inference, env producers, judges, orchestrator and trainer as local
    processes, with a live dashboard. Stops at max_steps (after the final evaluation) or on
    Ctrl-C."""
    require_train_extra("rlbus run")
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
    except TeacherError as exc:
        raise fail(exc) from None
    except (RuntimeError, TimeoutError) as exc:
        raise fail(exc) from exc
    done = f"run {cfg.run_id} finished at step {cfg.max_steps}"
    console.print(done if code == 0 else f"orchestrator exited {code}")
    query = f"SELECT * FROM reward_by_step WHERE run_id = '{cfg.run_id}' ORDER BY step"
    console.print(f'query it: rlbus sql "{query}"')


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command("run", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(run_command)
