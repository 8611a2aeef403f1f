"""`rlbus quickstart`: the whole post-training loop on embedded defaults (rlbus.launch.quickstart
does the work), then what it did and where to look next."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    exits_on,
    require_train_extra,
)
from rlbus.config import ConfigError
from rlbus.console import console

if TYPE_CHECKING:
    from rlbus.launch.quickstart import Result

UI_PORT = 8765
COLUMNS = ("rollouts", "events", "tokens")
"""A stage's figures from the store, in the table's order."""


def quickstart(
    ctx: typer.Context,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="Evaluate and train this Hugging Face model directory (e.g. from `rlbus model "
            "import`) instead of a tiny one made and warmed up here; it is asked with "
            "reverse_text's instruction.",
            exists=True,
            file_okay=False,
        ),
    ] = None,
    teacher_tasks: Annotated[
        int, typer.Option(help="Training tasks the scripted teacher answers.", min=1)
    ] = 2048,
    sft_steps: Annotated[int, typer.Option(help="SFT steps of 64 samples.", min=1)] = 100,
    config: ConfigOption = None,
) -> None:
    """The whole post-training loop on embedded defaults, in a few minutes on two CPU cores: a
    tiny model, tasks, its held-out reward, a scripted teacher's rollouts, SFT on them
    replayed from ClickHouse, a short GRPO run with hot weight reload, held-out reward again.
    Run settings follow as overrides (e.g. --max-steps 80 --orchestrator.eval-tasks 256)."""
    require_train_extra("rlbus quickstart")
    from transformers.utils import logging as hf_logging

    from rlbus.launch.quickstart import Quickstart, QuickstartError, Sizes

    hf_logging.disable_progress_bar()  # each stage has its own bar

    with exits_on(QuickstartError, ConfigError, RuntimeError, TimeoutError):
        result = Quickstart(list(ctx.args), config, model, Sizes(teacher_tasks, sft_steps)).run()
    show(result)


def _figure(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def show(result: Result) -> None:
    """The stages' table, where to look next, and last the line a script reads."""
    before, after_sft, after_rl = result.held_out
    held_out: dict[str, tuple[float, float]] = dict(
        zip(("baseline", "sft", "rl"), zip(result.held_out, result.exact, strict=True), strict=True)
    )
    table = Table(
        "stage",
        "held-out reward",
        "exact match",
        "rollouts",
        "events",
        "tokens",
        "seconds",
        title=f"rlbus quickstart {result.runs.prefix}",
    )
    for stage in result.stages:
        if stage.skipped:
            table.add_row(stage.name, f"skipped: {stage.skipped}")
            continue
        reward, exact = held_out.get(stage.name, (None, None))
        table.add_row(
            stage.name,
            _figure(reward),
            _figure(exact),
            *(f"{stage.counts[k]:,}" if k in stage.counts else "" for k in COLUMNS),
            f"{stage.seconds:.1f}",
        )
    table.add_section()
    table.add_row("total", *[""] * 5, f"{result.seconds:.1f}")
    console.print()
    console.print(table)
    console.print(
        f"held-out: {result.held_out_rollouts:,} rollouts of the same tasks each time (never "
        f"trained on); after SFT is the RL run's version 0, after RL its version "
        f"{result.final_version}"
    )
    runs = result.runs
    names = ", ".join(s.run_id for s in result.stages if s.run_id and not s.skipped)
    console.print(f"runs in the store: {names}", markup=False, soft_wrap=True)
    made = ", ".join(f"{name} {path}" for name, path in result.models.items())
    console.print(f"models: {made}", markup=False, soft_wrap=True)
    console.print("\nlook at it (runs, curves, rollouts, token strips, SQL):")
    url = f"http://127.0.0.1:{UI_PORT}"
    console.print(f"  rlbus ui --port {UI_PORT}", markup=False)
    console.print(
        f"  then {url}/runs/{runs.of('rl')} and, before and after side by side, "
        f"{url}/compare?a={runs.of('baseline')}&b={runs.of('rl')}",
        markup=False,
        soft_wrap=True,
    )
    console.print("query it:")
    for sql in queries(result):
        console.print(f'  rlbus sql "{sql}"', markup=False, soft_wrap=True)
    console.print("make it a data set (the RL run's right answers, chat format):")
    export = f"rlbus export --run {runs.of('rl')} --where 'reward >= 1' --out {runs.prefix}.jsonl"
    console.print(f"  {export}", markup=False, soft_wrap=True)
    train = f"rlbus run {result.rl_config} --run-id NEW-ID"
    console.print(f"train longer: {train} --max-steps 100", markup=False, soft_wrap=True)
    # Last, on a line of its own and with no markup: what a script reads.
    print(f"held-out reward: {before:.3f} → {after_sft:.3f} → {after_rl:.3f}")


def queries(result: Result) -> list[str]:
    """Two or three queries to try on this quickstart's runs, as `rlbus sql` takes them."""
    from rlbus.bus.store.reads.quickstart import to_try

    return to_try(result.runs.prefix, result.runs.of("rl"), result.final_version)


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(quickstart)
