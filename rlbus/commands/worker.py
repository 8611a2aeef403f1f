"""`rlbus worker ROLE`: one role as a long-lived consumer-group member. Each command here only
reads its options and calls the role's entry function; `ROLES` is the table of them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import typer

from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    ResumeOption,
    exits_on,
    fail,
    require_train_extra,
    run_until_signal,
    settings_from,
    start_role,
)
from rlbus.commands.eval import EnvArgument
from rlbus.config import ConfigError, Settings
from rlbus.config.env import cli_overrides
from rlbus.config.runs import RunConfig, load_run_config
from rlbus.console import console
from rlbus.consumers.inference.api import BackendKind
from rlbus.discovery import local_broker


def _settings(ctx: typer.Context, config: Path | None, role: str) -> Settings:
    return start_role(settings_from(ctx, config), role)


def _run_config(ctx: typer.Context, config: Path | None, role: str) -> RunConfig:
    with exits_on(ConfigError):
        return start_role(load_run_config(config, list(ctx.args)), role)


def sink(ctx: typer.Context, config: ConfigOption = None) -> None:
    """Consume every topic into ClickHouse; serve read-only SQL to other processes meanwhile.
    While another sink holds a chdb store, wait as its standby."""
    from rlbus.consumers.sink.main import run as hold_store

    settings = _settings(ctx, config, "sink")
    console.print(f"sink: {settings.kafka.bootstrap_servers} -> {settings.store.url}")

    def served(url: str) -> None:
        console.print(f"read-only SQL endpoint: {url}")

    async def main(stop: asyncio.Event) -> int:
        sink = await hold_store(settings, stop, served)
        return sink.rows_written if sink is not None else 0

    console.print(f"sink stopped after writing {run_until_signal(main):,} rows")


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
    run_envs: Annotated[
        str | None,
        typer.Option(
            help="Every environment of the run, comma-separated: the producer of the first "
            "dead-letters tasks naming none of them."
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Env producer: consume `tasks` of ENV, run each task's group, publish traces, tokens and
    rollouts."""
    from rlbus.environment import load_environment
    from rlbus.producers.main import run as run_env_producer

    settings = _settings(ctx, config, "env")
    with exits_on(ConfigError):
        environment = load_environment(
            env_spec, cli_overrides(model, base_url, mode=mode, tokenizer=tokenizer)
        )
    c = environment.config
    console.print(
        f"env producer {environment.id}: {c.harness.kind} harness, {c.runtime.kind} runtime, "
        f"{c.model.mode} mode -> {c.model.base_url}"
    )

    async def main(stop: asyncio.Event) -> int:
        envs = frozenset(e for e in (run_envs or "").split(",") if e)
        return (await run_env_producer(settings, environment, stop, run_envs=envs)).rollouts

    console.print(f"env producer stopped after {run_until_signal(main):,} rollouts")


def judge(
    ctx: typer.Context,
    env_specs: Annotated[
        list[str], typer.Argument(metavar="ENV...", help="Environments whose rollouts to score.")
    ],
    config: ConfigOption = None,
) -> None:
    """Judge: consume `rollouts` of the given environments, publish `scored` (group rewards once
    a group is complete)."""
    from rlbus.consumers.judge.main import run as run_judge
    from rlbus.environment import load_environment

    # ENV... takes every word the options parser leaves, overrides included: they begin at the
    # first word that starts with "--".
    cut = next((i for i, spec in enumerate(env_specs) if spec.startswith("--")), len(env_specs))
    env_specs, ctx.args = env_specs[:cut], [*env_specs[cut:], *ctx.args]
    if not env_specs:
        raise fail("rlbus worker judge: name the environments (ENV...) before any override")
    settings = _settings(ctx, config, "judge")
    with exits_on(ConfigError):
        environments = [load_environment(spec, {}) for spec in env_specs]
    console.print(
        f"judge for {', '.join(e.id for e in environments)} (run {settings.run_id!r})",
        markup=False,
    )

    async def main(stop: asyncio.Event) -> int:
        return (await run_judge(settings, environments, stop)).scored

    console.print(f"judge stopped after scoring {run_until_signal(main):,} rollouts")


def inference(
    ctx: typer.Context,
    model: Annotated[
        str, typer.Option(help="Hugging Face model directory (e.g. from `rlbus model init`).")
    ],
    host: Annotated[
        str, typer.Option(help="Address to bind; 0.0.0.0 in a container.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="HTTP port of the OpenAI-compatible and token endpoints.")
    ] = 8000,
    backend: Annotated[
        BackendKind, typer.Option(help="hf: built-in transformers engine; vllm: GPU extra.")
    ] = "hf",
    device: Annotated[str, typer.Option(help="torch device for the hf backend.")] = "cpu",
    threads: Annotated[
        int | None, typer.Option(help="torch intra-op threads (1 suits tiny models).")
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            help="/v1 URL env producers reach this server by, announced on the bus with every "
            "weights version it loads (unset: http://HOST:PORT/v1, this machine's name for "
            "0.0.0.0)."
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Serve a model (OpenAI chat completions, token-in/token-out generate, score) and load
    every WeightVersion of the run as it is published. With no broker configured or announced,
    it starts one for as long as it serves (a model server is often the first thing started)."""
    require_train_extra("rlbus worker inference")
    from rlbus.consumers.inference.main import run as serve

    with local_broker(settings_from(ctx, config)) as (found, started):
        settings: Settings = start_role(found, "inference")
        if started is not None:
            console.print(
                f"started an embedded broker at {started.bootstrap_servers} "
                "(other local commands find it; it stops with this server)"
            )
        console.print(
            f"[bold]inference[/bold] {Path(model).name} ({backend} on {device}) at "
            f"http://{host}:{port}/v1, following weights of run {settings.run_id!r}"
        )
        run_until_signal(
            lambda stop: serve(
                settings,
                model,
                stop,
                host=host,
                port=port,
                backend=backend,
                device=device,
                threads=threads,
                url=url,
            )
        )


def trainer(ctx: typer.Context, config: ConfigOption = None, resume: ResumeOption = False) -> None:
    """Trainer: consume `batches`, one optimizer step each; publish WeightVersion and TrainStep.
    Under torchrun (trainer.parallel = "fsdp" or "torchtitan") every rank runs this; rank 0
    consumes."""
    require_train_extra("rlbus worker trainer")
    from rlbus.consumers.trainer.checkpoint import NothingToResume
    from rlbus.consumers.trainer.main import trainer_role
    from rlbus.consumers.trainer.session import CheckpointExists

    cfg = _run_config(ctx, config, "trainer")
    with exits_on(NothingToResume, CheckpointExists), trainer_role(cfg, resume) as role:
        s = role.session
        console.print(
            f"trainer: {cfg.model} at step {s.state.step}, checkpoints {s.checkpoints.url}"
        )
        if not role.leads:
            role.follow()
            return
        console.print(f"trainer stopped at step {run_until_signal(role.run)}")


def orchestrator(
    ctx: typer.Context, config: ConfigOption = None, resume: ResumeOption = False
) -> None:
    """Orchestrator: scored rollouts -> TrainBatches; publishes tasks with bounded work in flight.
    (It follows the trainer's announced version, so --resume needs nothing of it.) One leads a
    run: another started for it waits as a standby and takes over when the leader is gone."""
    from rlbus.consumers.orchestrator.loop import summary
    from rlbus.consumers.orchestrator.main import run as orchestrate

    cfg = _run_config(ctx, config, "orchestrator")
    base_dir = config.parent if config else Path.cwd()
    with exits_on(ConfigError, KeyError, ValueError):
        orch = run_until_signal(lambda stop: orchestrate(cfg, base_dir, stop))
    if orch is None or not orch.done.is_set():
        raise typer.Exit(3)  # stopped before max_steps: the launcher tells the two apart
    console.print(summary(orch))


ROLES: dict[str, Callable[..., None]] = {
    "sink": sink,
    "env": env,
    "judge": judge,
    "inference": inference,
    "trainer": trainer,
    "orchestrator": orchestrator,
}


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    for name, command in ROLES.items():
        worker_app.command(name, context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(command)
