"""`rlbus eval ENV`: evaluate any OpenAI-compatible endpoint on an environment, with every event
on the bus and in ClickHouse. With no broker configured it starts the embedded one and a sink
process, as `rlbus quickstart` does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlbus.bus import Bus
from rlbus.bus.store import open_store
from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    console,
    err_console,
    settings_from,
)
from rlbus.config import ConfigError, Settings, data_dir
from rlbus.discovery import local_broker, store_served_elsewhere
from rlbus.processes import RoleProcess, wait_for
from rlbus.producers.environment import Environment, load_environment
from rlbus.producers.eval_report import Report, eval_report, latest_run, scored_tasks
from rlbus.producers.evaluation import EvalPipeline, Tally
from rlbus.producers.interception import InterceptionServer, make_backend
from rlbus.producers.rollouts import RolloutRunner
from rlbus.schemas import TaskPublished, derived_id


class EvalError(RuntimeError):
    """An evaluation that cannot start or finish; the message says what to do."""


@dataclass
class EvalResult:
    run_id: str
    tally: Tally
    """This invocation's rollouts (a resumed run's earlier ones are only in `report`)."""
    report: Report
    skipped_tasks: int
    seconds: float
    """Wall time from the first rollout to the last score landing in the store."""


EnvArgument = Annotated[
    str,
    typer.Argument(
        metavar="ENV",
        help="env.toml, a directory holding one, an installed "
        "environment id, module:Class or FILE.py[:Class].",
    ),
]


def env_overrides(
    model: str | None,
    base_url: str | None,
    group_size: int | None = None,
    concurrency: int | None = None,
    harness: str | None = None,
    runtime: str | None = None,
    mode: str | None = None,
    tokenizer: str | None = None,
) -> dict[str, Any]:
    """EnvConfig overrides from a command line (unset options leave the TOML's values)."""
    model_cfg = {
        k: v
        for k, v in {
            "name": model,
            "base_url": base_url,
            "mode": mode,
            "tokenizer": tokenizer,
        }.items()
        if v is not None
    }
    out: dict[str, Any] = {"model": model_cfg}
    if group_size is not None:
        out["group_size"] = group_size
    if concurrency is not None:
        out["max_concurrent_rollouts"] = concurrency
    if harness is not None:
        out["harness"] = {"kind": harness}
    if runtime is not None:
        out["runtime"] = {"kind": runtime}
    return out


def _tasks(env: Environment, run_id: str, n: int, skip: set[str]) -> Iterator[TaskPublished]:
    for task in env.tasks(run_id).take(n):
        if task.task_id in skip:
            continue
        # Stable per run and task, so a resumed or repeated run republishes the same ids.
        task.event_id = derived_id("eval-task", run_id, task.task_id)
        task.run_id = run_id
        yield task


def _scored(url: str, run_id: str, env_id: str) -> int:
    with open_store(url, read_only=True) as store:
        return int(
            store.query(
                "SELECT count() FROM scored FINAL WHERE run_id = {run:String} AND env = {env:String}",
                {"run": run_id, "env": env_id},
            ).rows[0][0]
        )


async def _evaluate(
    settings: Settings,
    env: Environment,
    tasks: Iterator[TaskPublished],
    on_group: Callable[[Tally], None],
) -> Tally:
    async with (
        Bus(settings) as bus,
        InterceptionServer(make_backend(env.config.model), env.config.sampling) as server,
    ):
        return await EvalPipeline(RolloutRunner(env, server), bus, on_group).run(tasks)


def run_eval(
    env: Environment,
    settings: Settings,
    *,
    n: int,
    run_id: str | None = None,
    resume: bool = False,
    pass_threshold: float = 1.0,
    store_timeout_s: float = 300,
    show_progress: bool = True,
) -> EvalResult:
    """Run the evaluation; returns once every score is in the store."""
    logs = data_dir(settings) / "logs"
    with local_broker(settings) as live:
        sink = None
        if not store_served_elsewhere(live):
            sink = RoleProcess("sink", live, logs)
        try:
            if sink is not None:
                wait_for(
                    lambda: store_served_elsewhere(live),
                    120,
                    "the sink to serve the store",
                    processes=(sink,),
                )
            url = live.store.url
            if resume and run_id is None:
                with open_store(url, read_only=True) as store:
                    run_id = latest_run(store, env.id, env.config.model.name)
                if run_id is None:
                    raise EvalError(
                        f"--resume: no earlier run of {env.id} with model {env.config.model.name!r} "
                        f"in {url}; pass --run-id, or drop --resume to start one"
                    )
            run_id = run_id or f"eval-{env.id}-{time.strftime('%Y%m%d-%H%M%S')}"
            done: set[str] = set()
            if resume:
                with open_store(url, read_only=True) as store:
                    done = scored_tasks(store, run_id, env.id)
            before = _scored(url, run_id, env.id)
            live = live.model_copy(update={"run_id": run_id})
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("errors {task.fields[errors]}"),
                TextColumn("reward {task.fields[reward]:.3f}"),
                TimeElapsedColumn(),
            )
            started = time.monotonic()
            with Progress(*columns, console=console, disable=not show_progress) as progress:
                size = env.config.group_size
                bar = progress.add_task(
                    f"{env.id} ({run_id})", total=max(0, n - len(done)) * size, errors=0, reward=0.0
                )

                def on_group(tally: Tally) -> None:
                    progress.update(
                        bar, completed=tally.rollouts, errors=tally.errors, reward=tally.mean_reward
                    )

                tally = asyncio.run(_evaluate(live, env, _tasks(env, run_id, n, done), on_group))
                landed = progress.add_task(
                    "in ClickHouse", total=before + tally.rollouts, errors="", reward=0.0
                )

                def all_landed() -> bool:
                    count = _scored(url, run_id, env.id)
                    progress.update(landed, completed=count)
                    return count >= before + tally.rollouts

                wait_for(
                    all_landed,
                    store_timeout_s,
                    f"{tally.rollouts} scores of run {run_id} in the store",
                    processes=(sink,) if sink else (),
                )
            seconds = time.monotonic() - started
            with open_store(url, read_only=True) as store:
                report = eval_report(store, run_id, env.id, pass_threshold)
        finally:
            if sink is not None:
                sink.stop()
    return EvalResult(run_id, tally, report, len(done), seconds)


def render(result: EvalResult, env: Environment) -> None:
    report = result.report
    summary = Table(
        title=f"{env.id} · {env.config.model.name} · run {result.run_id}", show_header=False
    )
    rate = result.tally.rollouts / result.seconds if result.seconds else 0.0
    for name, value in (
        (
            "tasks",
            f"{report.tasks:,}"
            + (f" ({result.skipped_tasks:,} resumed)" if result.skipped_tasks else ""),
        ),
        ("rollouts", f"{report.rollouts:,}"),
        ("mean reward", f"{report.mean_reward:.4f}"),
        (
            "this invocation",
            f"{result.tally.rollouts:,} rollouts in {result.seconds:.1f}s ({rate:.1f}/s)",
        ),
        ("prompt tokens", f"{report.prompt_tokens:,}"),
        ("completion tokens", f"{report.completion_tokens:,}"),
        *((f"pass@{k}", f"{v:.4f}") for k, v in report.pass_at.items()),
    ):
        summary.add_row(name, value)
    console.print(summary)
    scores = Table(
        "function",
        "kind",
        "weight",
        "mean",
        title="rewards and metrics (rollouts scored without error)",
    )
    weights = env.rules.weights
    for name, value in report.rewards.items():
        scores.add_row(name, "reward", f"{weights.get(name, 1.0):g}", f"{value:.4f}")
    for name, value in report.metrics.items():
        scores.add_row(name, "metric", "", f"{value:.4f}")
    console.print(scores)
    if report.errors:
        errors = Table("kind", "rollouts", title="errors")
        for kind, count in report.errors.items():
            errors.add_row(kind, f"{count:,}")
        console.print(errors)
    console.print(
        f"query it: rlbus sql \"SELECT * FROM scored FINAL WHERE run_id = '{result.run_id}'\""
    )


def eval_command(
    ctx: typer.Context,
    env_spec: EnvArgument,
    model: Annotated[str, typer.Option("--model", "-m", help="Model name sent to the endpoint.")],
    base_url: Annotated[
        str | None, typer.Option(help="OpenAI-compatible /v1 URL (unset: the environment's).")
    ] = None,
    n: Annotated[
        int, typer.Option("-n", help="Tasks to evaluate (the first N of the task set).")
    ] = 32,
    group_size: Annotated[
        int | None, typer.Option("-r", "--rollouts", help="Rollouts per task (group size).")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option("-c", "--concurrency", help="Rollouts in flight at once.")
    ] = None,
    harness: Annotated[
        Literal["single", "tools", "command"] | None, typer.Option(help="Override the harness.")
    ] = None,
    runtime: Annotated[
        Literal["local", "subprocess", "docker"] | None, typer.Option(help="Override the runtime.")
    ] = None,
    mode: Annotated[
        Literal["eval", "train"] | None,
        typer.Option(help="train: token-in/token-out backend with exact ids."),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="Train mode: model directory whose tokenizer renders prompts."),
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="Run id (default: eval-ENV-TIMESTAMP).")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Skip tasks already scored in this run (default: the latest run of ENV with MODEL).",
        ),
    ] = False,
    pass_threshold: Annotated[
        float, typer.Option(help="A rollout passes (for pass@k) when its reward is at least this.")
    ] = 1.0,
    config: ConfigOption = None,
) -> None:
    """Evaluate a model on an environment: live progress, a summary table, every event stored."""
    settings = settings_from(ctx, config)
    try:
        env = load_environment(
            env_spec,
            env_overrides(
                model, base_url, group_size, concurrency, harness, runtime, mode, tokenizer
            ),
        )
        if not env.config.model.base_url:
            raise ConfigError(
                "no endpoint: pass --base-url or set [env.model] base_url in the environment's TOML"
            )
        result = run_eval(
            env, settings, n=n, run_id=run_id, resume=resume, pass_threshold=pass_threshold
        )
    except (ConfigError, EvalError) as exc:
        err_console.print(str(exc), style="red", markup=False)
        raise typer.Exit(2) from exc
    render(result, env)


def register(app: typer.Typer) -> None:
    app.command("eval", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(eval_command)
