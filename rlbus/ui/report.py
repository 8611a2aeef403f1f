"""`rlbus report RUN`: a run's page as files: one PNG per curve that has data and one HTML file
holding them (base64 PNGs, inline style, no script, nothing fetched), with the run's summary and
its environment, pass@k, error and incident tables. The data is the run page's
(Queries.run_page), the curves its figures (rlbus.ui.figures); drawn with matplotlib, the
`plots` extra. `png` also draws bench/learning.py's plots."""

from __future__ import annotations

import base64
import io
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from markupsafe import Markup

from rlbus.config.secret import SecretUrl
from rlbus.ui.charts import format_number
from rlbus.ui.figures import TABLES, Figure, run_figures
from rlbus.ui.queries import Queries
from rlbus.ui.source import StoreSource

INSTALL = "pip install 'rlbus[plots]' (or: pip install matplotlib)"


class ReportError(RuntimeError):
    """A report that cannot be made; the message says what to do."""


def pyplot() -> Any:
    """matplotlib.pyplot on a file-only backend, or ReportError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError(f"plots need matplotlib, which is not installed: {INSTALL}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw(ax: Any, figure: Figure) -> None:
    """One figure on matplotlib axes: its curves, title and axis labels (the y axis's with its
    unit); a None value breaks a line."""
    from matplotlib import ticker

    for s in figure.series:
        points = sorted(s.points, key=lambda p: p[0])
        if any(y is not None for _, y in points):
            ys = [math.nan if y is None else y for _, y in points]
            ax.plot([x for x, _ in points], ys, marker="o", markersize=3, label=s.name)
    ax.set(title=figure.title, xlabel=figure.x_label, ylabel=figure.y_axis)
    xs = [x for s in figure.series for x, _ in s.points]
    if xs and all(float(x).is_integer() for x in xs):  # steps and versions
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small")


def png(figures: Sequence[Figure], columns: int = 1, dpi: int = 110) -> bytes:
    """The figures side by side (`columns` per row) as one PNG."""
    plt = pyplot()
    rows = math.ceil(len(figures) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.6 * columns, 3.6 * rows), squeeze=False)
    try:
        for ax, figure in zip(axes.flat, figures, strict=False):
            draw(ax, figure)
        for ax in list(axes.flat)[len(figures) :]:
            ax.set_visible(False)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi)
        return buffer.getvalue()
    finally:
        plt.close(fig)


@dataclass
class Report:
    html: Path
    pngs: dict[str, Path]
    """Curve name -> its PNG, for each curve that has data."""


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1180px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border-bottom: 1px solid #ddd; padding: .25em .7em; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.figures { display: flex; flex-wrap: wrap; gap: 1em; }
.figures img { width: 560px; max-width: 100%; border: 1px solid #eee; }
.muted { color: #777; }
"""

SUMMARY = (
    "mode",
    "envs",
    "models",
    "harnesses",
    "rollouts",
    "errors",
    "steps",
    "first_ts",
    "last_ts",
)
REPORTED = ("envs", "pass_at_k", "errors", "teachers", "incidents")
"""The run page's tables (rlbus.ui.figures.TABLES) the report holds."""


def _cell(value: Any) -> Markup:
    if isinstance(value, bool) or value is None:
        return Markup("<td>{}</td>").format("–" if value is None else value)
    if isinstance(value, int | float):
        return Markup('<td class="n">{}</td>').format(format_number(value))
    if isinstance(value, datetime):
        return Markup("<td>{}</td>").format(value.strftime("%Y-%m-%d %H:%M:%S"))
    if isinstance(value, list | tuple):
        return Markup("<td>{}</td>").format(", ".join(map(str, value)))
    return Markup("<td>{}</td>").format(value)


def _table(rows: list[dict[str, Any]]) -> Markup:
    if not rows:
        return Markup('<p class="muted">no rows</p>')
    head = Markup("").join(Markup("<th>{}</th>").format(k) for k in rows[0])
    body = Markup("").join(
        Markup("<tr>{}</tr>").format(Markup("").join(_cell(v) for v in row.values()))
        for row in rows
    )
    return Markup("<table><tr>{}</tr>{}</table>").format(head, body)


def html_page(
    run_id: str,
    store: str,
    version: str,
    summary: dict[str, Any],
    data: dict[str, list[dict[str, Any]]],
    images: dict[str, tuple[Figure, bytes]],
) -> str:
    scores = f"scorer version {version}" if version else "each rollout's newest score"
    figures = Markup("").join(
        Markup('<figure><img alt="{}: {}" src="data:image/png;base64,{}"></figure>').format(
            figure.title, figure.y_axis, base64.b64encode(image).decode()
        )
        for figure, image in images.values()
    )
    sections = Markup("").join(
        Markup("<h2>{}</h2>{}").format(TABLES[key], _table(data[key])) for key in REPORTED
    )
    facts = [{"": k, "value": summary.get(k)} for k in SUMMARY]
    return str(
        Markup(
            '<!doctype html><html lang="en"><head><meta charset="utf-8">'
            "<title>rlbus report: {run}</title><style>{style}</style></head><body>"
            "<h1>run {run}</h1>"
            '<p class="muted">{store} · {scores} · made {made}</p>{summary}'
            '<h2>Curves</h2><div class="figures">{figures}</div>{sections}</body></html>'
        ).format(
            run=run_id,
            style=Markup(STYLE),
            store=store,
            scores=scores,
            made=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            summary=_table(facts),
            figures=figures or Markup('<p class="muted">no curve has data yet</p>'),
            sections=sections,
        )
    )


def write_report(store_url: str, run_id: str, out: Path, version: str = "") -> Report:
    """Read the run's page from the store (read-only), write its PNGs and `report.html` into
    `out`."""
    pyplot()  # before any reading: say how to install it first
    source = StoreSource(store_url, "rlbus report")
    queries = Queries(source)
    try:
        summary, data = queries.run_page(run_id, version)
        if summary is None:
            known = ", ".join(queries.run_ids()[:20]) or "none"
            raise ReportError(f"no run {run_id!r} in {SecretUrl(store_url)} (runs: {known})")
    finally:
        queries.close()
        source.close()
    images = {
        name: (figure, png([figure]))
        for name, figure in run_figures(data).items()
        if figure.has_data
    }
    out.mkdir(parents=True, exist_ok=True)
    pngs = {}
    for name, (_, image) in images.items():
        pngs[name] = out / f"{name}.png"
        pngs[name].write_bytes(image)
    html = out / "report.html"
    html.write_text(html_page(run_id, str(SecretUrl(store_url)), version, summary, data, images))
    return Report(html, pngs)
