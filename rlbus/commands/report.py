"""`rlbus report RUN`: the run's curves and tables as one self-contained HTML file plus PNGs
(rlbus.ui.report does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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


def report_command(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="The run to report on.")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Directory to write into (default: rlbus-report-RUN here)."),
    ] = None,
    scorer_version: ScorerVersionOption = "",
    config: ConfigOption = None,
) -> None:
    """A run's report: reward, held-out evaluation, loss, staleness, drops, throughput and weight
    update curves, and the memory and consumer lag `rlbus run` sampled (those with data), as
    PNGs, and one HTML file holding them with the run's tables (incidents among them); nothing
    in it is fetched from anywhere. Needs matplotlib (the `plots` extra)."""
    from rlbus.bus.store import StoreError
    from rlbus.ui.report import ReportError, write_report

    settings = settings_from(ctx, config)
    with exits_on(ReportError, StoreError):
        report = write_report(
            settings.store.url, run, out or Path(f"rlbus-report-{run}"), scorer_version
        )
    curves = ", ".join(report.pngs) or "none has data yet"
    console.print(f"{report.html} (curves: {curves})")


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command("report", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(report_command)
