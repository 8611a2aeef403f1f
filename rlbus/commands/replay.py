"""`rlbus replay sft`: SFT on stored rollouts (their exact token ids and loss masks)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import TextColumn

from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    ScorerVersionOption,
    exits_on,
    require_train_extra,
    settings_from,
)
from rlbus.config.runs import ReplayConfig
from rlbus.console import console, progress

replay_app = typer.Typer(
    help="Train on stored rollouts (exact stored token ids, never re-rendered text).",
    no_args_is_help=True,
)


@replay_app.command("sft", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def replay_sft_command(
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
    require_train_extra("rlbus replay sft")
    from rlbus.consumers.orchestrator.stored_samples import ReplayError
    from rlbus.launch.replay_sft import ReplayRunError, Selection, read_samples
    from rlbus.launch.replay_sft import replay_sft as replay

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
    app.add_typer(replay_app, name="replay")
