"""`rlbus rescore ENV --run RUN`: score a run's stored rollouts again with the environment's
current rules (rlbus.launch.rescore does the work), then the new version's summary."""

from __future__ import annotations

from typing import Annotated

import typer

from rlbus.commands.common import OVERRIDES, OVERRIDES_HELP, ConfigOption, exits_on, settings_from
from rlbus.commands.eval import EnvArgument, render_report
from rlbus.config import ConfigError
from rlbus.console import console
from rlbus.environment import load_environment
from rlbus.launch.rescore import RescoreError, rescore


def rescore_command(
    ctx: typer.Context,
    env_spec: EnvArgument,
    run: Annotated[str, typer.Option("--run", help="The run whose rollouts to score again.")],
    where: Annotated[
        str,
        typer.Option(
            help="Only rollouts matching this SQL condition over the `rollouts` table, e.g. "
            "\"status = 'ok' AND sample_index < 2\"."
        ),
    ] = "",
    version: Annotated[
        str | None,
        typer.Option(
            "--as",
            help="Scorer version to publish the scores as (default: a digest of the rules, "
            "`rules-xxxxxxxx`, which changes when they do).",
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Score stored rollouts again with the environment's current rewards (group rewards over
    the stored groups), without regenerating them: the scores go to `scored` under a scorer
    version, next to the earlier ones."""
    settings = settings_from(ctx, config)
    with exits_on(ConfigError, RescoreError):
        env = load_environment(env_spec)
        result = rescore(env, settings, run_id=run, where=where, version=version)
    skipped = f" ({result.skipped:,} already scored as {result.version}, skipped)"
    done = f"{result.tally.rollouts:,} in {result.seconds:.1f}s"
    render_report(
        result.report,
        env,
        f"{env.id} · run {run} · rescored as {result.version}",
        [
            ("selected", f"{result.selected:,}" + (skipped if result.skipped else "")),
            ("rescored now", done),
        ],
    )
    console.print(
        'compare versions: rlbus sql "SELECT scorer_version, avg(reward) FROM scored FINAL '
        f"WHERE run_id = '{run}' GROUP BY scorer_version\"; views: "
        f"reward_by_step_at(version = '{result.version}')"
    )


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command("rescore", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(rescore_command)
