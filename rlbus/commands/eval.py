"""`rlbus eval ENV`: evaluate any OpenAI-compatible endpoint on an environment, with every event
on the bus and in ClickHouse (rlbus.launch.eval does the work); a summary table at the end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import typer
from rich.table import Table

from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    ScorerVersionOption,
    exits_on,
    settings_from,
)
from rlbus.config import ConfigError
from rlbus.config.env import cli_overrides
from rlbus.console import console
from rlbus.environment import Environment, load_environment
from rlbus.launch.eval import EvalError, EvalResult, run_eval
from rlbus.launch.eval_summary import EvalSummary

EnvArgument = Annotated[
    str,
    typer.Argument(
        metavar="ENV",
        help="env.toml, a directory holding one, an installed "
        "environment id, module:Class, FILE.py[:Class], or one from another framework: "
        "verifiers:NAME, openenv:PACKAGE, textarena:GAME (installed by `rlbus env install`), "
        "harbor:PATH.",
    ),
]


def _versions(counts: dict[str, int]) -> str:
    return ", ".join(f"{v or '(unversioned)'} ({n:,})" for v, n in counts.items())


def version_line(report: EvalSummary) -> str:
    """Which scores the summary counts, and the run's scorer versions when it has several."""
    counted = report.scorer_version or f"each rollout's newest: {_versions(report.counted)}"
    if len(report.versions) < 2:
        return counted
    return f"{counted}; versions: {_versions(report.versions)}"


def render_report(
    report: EvalSummary, env: Environment, title: str, extra: Sequence[tuple[str, str]] = ()
) -> None:
    """The summary every scoring command prints: one scorer version's rewards, pass@k, tokens
    and errors, as the store holds them."""
    summary = Table(title=title, show_header=False)
    for name, value in (
        *extra,
        ("rollouts", f"{report.rollouts:,}"),
        ("scorer version", version_line(report)),
        ("mean reward", f"{report.mean_reward:.4f}"),
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


def render(result: EvalResult, env: Environment) -> None:
    report = result.report
    rate = result.tally.rollouts / result.seconds if result.seconds else 0.0
    tasks = f"{report.tasks:,}" + (
        f" ({result.skipped_tasks:,} resumed)" if result.skipped_tasks else ""
    )
    invocation = f"{result.tally.rollouts:,} rollouts in {result.seconds:.1f}s ({rate:.1f}/s)"
    render_report(
        report,
        env,
        f"{env.id} · {env.config.model.name} · run {result.run_id}",
        [("tasks", tasks), ("this invocation", invocation)],
    )
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
        Literal["auto", "sandbox", "local", "subprocess", "docker"] | None,
        typer.Option(help="Override the runtime."),
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
            help="Skip tasks already scored in this run (default: the latest run of ENV with "
            "MODEL).",
        ),
    ] = False,
    pass_threshold: Annotated[
        float, typer.Option(help="A rollout passes (for pass@k) when its reward is at least this.")
    ] = 1.0,
    scorer_version: ScorerVersionOption = "",
    config: ConfigOption = None,
) -> None:
    """Evaluate a model on an environment: live progress, a summary table, every event stored."""
    settings = settings_from(ctx, config)
    options = (model, base_url, group_size, concurrency, harness, runtime, mode, tokenizer)
    with exits_on(ConfigError, EvalError):
        env = load_environment(env_spec, cli_overrides(*options))
        if not env.config.model.base_url:
            raise ConfigError(
                "no endpoint: pass --base-url or set [env.model] base_url in the environment's TOML"
            )
        result = run_eval(
            env,
            settings,
            n=n,
            run_id=run_id,
            resume=resume,
            pass_threshold=pass_threshold,
            scorer_version=scorer_version or None,
        )
    render(result, env)


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command("eval", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(eval_command)
