"""`rlbus worker ROLE`: one role as a long-lived consumer-group member. Each command here only
reads its options, builds the role through the registry (rlbus.launch.roles) and runs it
(`run_role`); `COMMANDS` is the table of them, one per role of the registry."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from rlbus.bus.role import RoleSummary
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
from rlbus.config.runs import InferenceSettings, RunConfig, load_run_config
from rlbus.console import console
from rlbus.consumers.inference.api import BackendKind
from rlbus.consumers.model_size import NotEnoughMemory
from rlbus.discovery import local_broker
from rlbus.launch.roles import build_role


def _settings(ctx: typer.Context, config: Path | None, role: str) -> Settings:
    return start_role(settings_from(ctx, config), role)


def _run_config(ctx: typer.Context, config: Path | None, role: str) -> RunConfig:
    with exits_on(ConfigError):
        return start_role(load_run_config(config, list(ctx.args)), role)


def sink(ctx: typer.Context, config: ConfigOption = None) -> None:
    """Consume every topic into ClickHouse; serve read-only SQL to other processes meanwhile.
    While another sink holds a chdb store, wait as its standby."""
    run_role("sink", _settings(ctx, config, "sink"))


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

    settings = _settings(ctx, config, "env")
    with exits_on(ConfigError):
        environment = load_environment(
            env_spec, cli_overrides(model, base_url, mode=mode, tokenizer=tokenizer)
        )
    envs = frozenset(e for e in (run_envs or "").split(",") if e)
    run_role("env", settings, environment, run_envs=envs)


def judge(
    ctx: typer.Context,
    env_specs: Annotated[
        list[str], typer.Argument(metavar="ENV...", help="Environments whose rollouts to score.")
    ],
    config: ConfigOption = None,
) -> None:
    """Judge: consume `rollouts` of the given environments, publish `scored` (group rewards once
    a group is complete)."""
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
    run_role("judge", settings, environments)


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
        BackendKind,
        typer.Option(
            help="hf: the built-in engine (its settings: --inference.hf.decode, .cache-length); "
            "vllm: in the environment `rlbus engine install vllm` makes (its settings: "
            "--inference.vllm.dtype, .kv-cache-gib, .max-model-len, .eager, "
            ".tensor-parallel-size)."
        ),
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
    frozen: Annotated[
        bool,
        typer.Option(
            help="Serve the model as loaded and follow no run's weights (a distillation "
            'teacher; `rlbus run` starts one for each `teacher = "run:RUN_ID@VERSION"`).'
        ),
    ] = False,
    adapter: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=URI: also score with the LoRA deltas at URI (a LoRA run's weights file) "
            "when a /v1/score request names NAME as its model; repeatable; with --frozen (LoRA "
            "teachers of one base on one engine)."
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Serve a model (OpenAI chat completions, token-in/token-out generate, score) and load
    every WeightVersion of the run as it is published. With no broker configured or announced,
    it starts one for as long as it serves (a model server is often the first thing started)."""
    require_train_extra("rlbus worker inference")
    adapters = adapter_options(adapter or [], frozen, backend)
    loaded = settings_from(ctx, config, InferenceSettings)
    if backend == "vllm":
        in_engine_environment(loaded.inference.python)
    with local_broker(loaded) as (found, started):
        settings = start_role(found, "inference")
        if started is not None:
            console.print(
                f"started an embedded broker at {started.bootstrap_servers} "
                "(other local commands find it; it stops with this server)"
            )
        options = {"host": host, "port": port, "backend": backend, "device": device}
        vllm = settings.inference.vllm
        with exits_on(NotEnoughMemory):
            run_role(
                "inference",
                settings,
                model,
                **options,
                threads=threads,
                url=url,
                vllm=vllm,
                hf=settings.inference.hf,
                frozen=frozen,
                adapters=adapters,
            )


def adapter_options(given: list[str], frozen: bool, backend: BackendKind) -> dict[str, str]:
    """`--adapter NAME=URI` options as {NAME: URI}, or the option's error."""
    if given and not frozen:
        raise typer.BadParameter(
            "adapters are LoRA deltas over the model as loaded: serve them with --frozen",
            param_hint="--adapter",
        )
    if given and backend != "hf":
        raise typer.BadParameter("adapters are served by --backend hf", param_hint="--adapter")
    adapters: dict[str, str] = {}
    for spec in given:
        name, _, uri = spec.partition("=")
        if not (name and uri) or name in adapters:
            said = "named twice" if name in adapters else "is not NAME=URI"
            raise typer.BadParameter(f"{spec!r} {said}", param_hint="--adapter")
        adapters[name] = uri
    return adapters


def in_engine_environment(configured_python: str) -> None:
    """Go on in the interpreter the vLLM backend runs under (re-executing this very command
    there, same process, so whoever started it still supervises it), or say what to install."""
    from rlbus.launch.engines import EngineError, engine_python

    with exits_on(EngineError):
        python = engine_python(configured_python)
    if Path(python).absolute() != Path(sys.executable).absolute():
        os.execv(python, [python, "-m", "rlbus", *sys.argv[1:]])


def trainer(ctx: typer.Context, config: ConfigOption = None, resume: ResumeOption = False) -> None:
    """Trainer: consume `batches`, one optimizer step each; publish WeightVersion and TrainStep.
    Under torchrun (trainer.parallel = "fsdp" or "torchtitan") every rank runs this; rank 0
    consumes."""
    require_train_extra("rlbus worker trainer")
    from rlbus.consumers.trainer.checkpoint import NothingToResume
    from rlbus.consumers.trainer.session import CheckpointExists, WrongBaseModel

    cfg = _run_config(ctx, config, "trainer")
    with exits_on(NothingToResume, CheckpointExists, WrongBaseModel, NotEnoughMemory):
        run_role("trainer", cfg, resume=resume)


def orchestrator(
    ctx: typer.Context, config: ConfigOption = None, resume: ResumeOption = False
) -> None:
    """Orchestrator: scored rollouts -> TrainBatches; publishes tasks with bounded work in flight.
    (It follows the trainer's announced version, so --resume needs nothing of it.) One leads a
    run: another started for it waits as a standby and takes over when the leader is gone."""
    cfg = _run_config(ctx, config, "orchestrator")
    base_dir = config.parent if config else Path.cwd()
    with exits_on(ConfigError, KeyError, ValueError):
        done = run_role("orchestrator", cfg, base_dir)
    if not done.finished:
        raise typer.Exit(3)  # stopped before max_steps: the launcher tells the two apart


def run_role(name: str, *args: Any, **options: Any) -> RoleSummary:
    """Build the role through the registry, say what it is about to do, run it until it is done
    or a signal comes, and say what it did."""
    role = build_role(name, *args, **options)

    async def described(stop: asyncio.Event) -> RoleSummary:
        # Said once the stop handlers are in place: a signal that follows this line ends the
        # role with its summary (one sent before them killed it mid-way, with nothing said).
        console.print(role.describe(), markup=False)
        return await role.run(stop)

    done = run_until_signal(described)
    console.print(done.said, markup=False)
    return done


COMMANDS: dict[str, Callable[..., None]] = {
    "sink": sink,
    "env": env,
    "judge": judge,
    "inference": inference,
    "trainer": trainer,
    "orchestrator": orchestrator,
}


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    for name, command in COMMANDS.items():
        worker_app.command(name, context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(command)
