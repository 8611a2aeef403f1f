"""`rlbus eval`, `rlbus worker env` (env producer) and `rlbus worker judge`."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import typer

from rlbus.bus.telemetry import setup_telemetry
from rlbus.commands import eval as eval_cmd
from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    console,
    err_console,
    run_until_signal,
    settings_from,
)
from rlbus.commands.eval import EnvArgument, env_overrides
from rlbus.config import ConfigError
from rlbus.discovery import require_bootstrap
from rlbus.producers.environment import Environment, load_environment


def _load(spec: str, overrides: dict) -> Environment:
    try:
        return load_environment(spec, overrides)
    except ConfigError as exc:
        err_console.print(str(exc), style="red", markup=False)
        raise typer.Exit(2) from exc


def env(
    ctx: typer.Context,
    env_spec: EnvArgument,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model name (unset: the environment's).")
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option(help="Eval: OpenAI-compatible /v1 URL; train: the inference server's /v1."),
    ] = None,
    mode: Annotated[
        Literal["eval", "train"] | None,
        typer.Option(help="eval (any endpoint) or train (token in/out)."),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="Train mode: model directory whose tokenizer renders prompts."),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Env producer: consume `tasks` of ENV, run each task's group, publish traces, tokens and rollouts."""
    from rlbus.producers.env_producer import run_env_producer

    settings = require_bootstrap(settings_from(ctx, config))
    setup_telemetry(settings.telemetry, "env")
    environment = _load(env_spec, env_overrides(model, base_url, mode=mode, tokenizer=tokenizer))
    console.print(
        f"env producer {environment.id}: {environment.config.harness.kind} harness, "
        f"{environment.config.runtime.kind} runtime, {environment.config.model.mode} mode "
        f"-> {environment.config.model.base_url}"
    )

    async def main(stop: asyncio.Event) -> int:
        return (await run_env_producer(settings, environment, stop)).rollouts

    console.print(f"env producer stopped after {run_until_signal(main):,} rollouts")


def judge(
    ctx: typer.Context,
    env_specs: Annotated[
        list[str], typer.Argument(metavar="ENV...", help="Environments whose rollouts to score.")
    ],
    config: ConfigOption = None,
) -> None:
    """Judge: consume `rollouts` of the given environments, publish `scored` (group rewards once a group is complete)."""
    from rlbus.consumers.judge import run_judge

    settings = require_bootstrap(settings_from(ctx, config))
    setup_telemetry(settings.telemetry, "judge")
    environments = [_load(spec, {}) for spec in env_specs]
    console.print(f"judge for {', '.join(e.id for e in environments)}")

    async def main(stop: asyncio.Event) -> int:
        return (await run_judge(settings, environments, stop)).scored

    console.print(f"judge stopped after scoring {run_until_signal(main):,} rollouts")


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    eval_cmd.register(app)
    for command in (env, judge):
        worker_app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(command)
