"""`rlbus export`: stored rollouts as a chat-format or token-level data set file
(rlbus.launch.export does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast

import typer

from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    ScorerVersionOption,
    exits_on,
    settings_from,
)
from rlbus.console import console


def export_command(
    ctx: typer.Context,
    where: Annotated[
        str,
        typer.Option(
            help="SQL condition over the columns of `scored` (run_id, env, task_id, reward, "
            "rewards, metrics, policy_version, ...), e.g. \"reward >= 1 AND env = 'calc'\"; "
            "runs read-only. Rollouts that scored with an error are never exported.",
        ),
    ] = "reward >= 1",
    fmt: Annotated[
        str,
        typer.Option("--format", help="jsonl or parquet."),
    ] = "jsonl",
    with_tokens: Annotated[
        bool,
        typer.Option(
            "--tokens",
            help="Exact token ids, loss masks (1 = sampled by the model) and log-probs, one row "
            "per trace branch, instead of chat messages.",
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="File to write (default: rlbus-export.FORMAT here)."),
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="Only rollouts of this run.")] = None,
    scorer_version: ScorerVersionOption = "",
    config: ConfigOption = None,
) -> None:
    """Write stored rollouts as a data set: OpenAI chat format (messages with tool calls, the
    tools offered, reward, env, task id, run), what TRL, axolotl and prime-rl's SFT read; or,
    with --tokens, the exact token ids and loss masks. `datasets.load_dataset` reads either."""
    from rlbus.bus.store import StoreError, open_store
    from rlbus.launch.export import ExportError, Format, export

    if fmt not in ("jsonl", "parquet"):
        raise typer.BadParameter(f"{fmt!r}: choose jsonl or parquet", param_hint="--format")
    settings = settings_from(ctx, config)
    path = out or Path(f"rlbus-export.{fmt}")
    with (
        exits_on(ExportError, StoreError),
        open_store(settings.store.url, read_only=True) as store,
    ):
        done = export(store, path, cast(Format, fmt), where, run_id, scorer_version, with_tokens)
    left_out = [
        f"{n:,} rollouts {why} left out"
        for n, why in (
            (done.without_tokens, "without token ids"),
            (done.without_messages, "without a stored RolloutCompleted"),
        )
        if n
    ]
    console.print(
        f"{done.rows:,} rows from {done.rollouts:,} rollouts -> {path}"
        + (f" ({'; '.join(left_out)})" if left_out else "")
    )
    kind = "parquet" if fmt == "parquet" else "json"
    console.print(f'read it: datasets.load_dataset("{kind}", data_files="{path}", split="train")')


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command("export", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(export_command)
