"""SVG charts drawn here, with no library and no script: line charts over steps (or any number)
and bar charts over labels. Each chart shows its title and its y axis's label (what it measures,
in which unit) above and beside the plot; every point carries a <title> with its exact value."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

WIDTH, HEIGHT = 520, 240
LEFT, RIGHT, BOTTOM = 66, 14, 30
TITLE_Y, LEGEND_Y, LEGEND_ROW = 16, 26, 15
"""The title's baseline, the first legend row's top, and each further row's height: the plot
starts below the legend's rows (a chart of many processes wraps its legend)."""
COLOURS = 10
"""Series colours are CSS classes s0..s9 (static/ui.css)."""


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float | None]]
    """(x, y); a None y (no value at that x) breaks the line."""


def format_number(value: float | int | None) -> str:
    """A figure for people: thousands separated, at most 4 significant digits."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2 or 5 times a power of ten apart)."""
    if hi - lo < 1e-12:
        lo, hi = lo - (abs(lo) or 1) * 0.5, hi + (abs(hi) or 1) * 0.5
    raw = (hi - lo) / (count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    start = math.floor(lo / step) * step
    steps = math.ceil((hi - start) / step - 1e-9)
    return [round(start + i * step, 12) for i in range(steps + 1)]


def _frame(title: str, y_label: str, body: list[str], legend: list[str], top: float) -> Markup:
    """The chart: its title, its y axis's label (centred on the plot, which starts at `top`),
    the legend and the plot."""
    label = escape(title)
    y_mid = (top + HEIGHT - BOTTOM) / 2
    return Markup(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{label}: {escape(y_label)}"><title>{label}</title>'
        f'<text class="title" x="8" y="{TITLE_Y}">{label}</text>'
        f'<text class="axis y" transform="rotate(-90)" x="{-y_mid:.1f}" y="14">'
        f"{escape(y_label)}</text>{''.join(legend)}{''.join(body)}</svg>"
    )


def _legend(names: Sequence[str]) -> tuple[list[str], float]:
    """Swatches and names in rows from LEGEND_Y, wrapped at the chart's width; and the top of
    the plot below them."""
    out, x, y = [], LEFT, LEGEND_Y
    for i, name in enumerate(names):
        width = 24 + 7 * len(name)
        if x > LEFT and x + width > WIDTH - RIGHT:
            x, y = LEFT, y + LEGEND_ROW
        out.append(
            f'<rect class="swatch s{i % COLOURS}" x="{x}" y="{y}" width="10" height="10"/>'
            f'<text class="legend" x="{x + 14}" y="{y + 9}">{escape(name)}</text>'
        )
        x += width
    return out, y + LEGEND_ROW + 8


def _y_grid(values: Sequence[float], py: Callable[[float], float]) -> list[str]:
    return [
        f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(t):.1f}" y2="{py(t):.1f}"/>'
        f'<text class="tick y" x="{LEFT - 6}" y="{py(t) + 4:.1f}">{format_number(t)}</text>'
        for t in values
    ]


def line_chart(
    series: Sequence[Series], title: str, x_label: str = "step", y_label: str = ""
) -> Markup:
    """`y_label`: what the y axis measures, with its unit ("resident memory (MiB)")."""
    drawn = [s for s in series if any(y is not None for _, y in s.points)]
    xs = [x for s in drawn for x, y in s.points if y is not None]
    ys = [y for s in drawn for _, y in s.points if y is not None]
    if not ys:
        return _frame(
            title,
            y_label,
            [f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}">no data yet</text>'],
            [],
            LEGEND_Y,
        )
    legend, top = _legend([s.name for s in series])
    y_ticks = ticks(min(ys), max(ys))
    x_ticks = ticks(min(xs), max(xs))
    if all(float(x).is_integer() for x in xs):
        x_ticks = sorted({round(t) for t in x_ticks})
    x0, x1 = min(x_ticks[0], min(xs)), max(x_ticks[-1], max(xs))
    y0, y1 = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - top - BOTTOM

    def px(x: float) -> float:
        return LEFT + (plot_w * (x - x0) / (x1 - x0) if x1 > x0 else plot_w / 2)

    def py(y: float) -> float:
        return top + plot_h - (plot_h * (y - y0) / (y1 - y0) if y1 > y0 else plot_h / 2)

    body = _y_grid(y_ticks, py)
    for t in x_ticks:
        body.append(
            f'<text class="tick x" x="{px(t):.1f}" y="{HEIGHT - BOTTOM + 16}">'
            f"{format_number(t)}</text>"
        )
    label = escape(x_label)
    body.append(f'<text class="axis x" x="{WIDTH - RIGHT}" y="{HEIGHT - 4}">{label}</text>')
    for i, s in enumerate(series):
        colour = f"s{i % COLOURS}"
        # each point's place, worked out once for the line and the dot (a console result can
        # have a thousand points)
        at = [None if y is None else (f"{px(x):.1f}", f"{py(y):.1f}") for x, y in s.points]
        path, pen_down = [], False
        for k in sorted(range(len(at)), key=lambda k: s.points[k][0]):
            point = at[k]
            if point is None:
                pen_down = False
                continue
            path.append(f"{'L' if pen_down else 'M'}{point[0]},{point[1]}")
            pen_down = True
        if path:
            body.append(f'<path class="line {colour}" d="{" ".join(path)}"/>')
        name = escape(s.name)
        for (x, y), xy in zip(s.points, at, strict=True):
            if xy is not None:
                cx, cy = xy
                body.append(
                    f'<circle class="dot {colour}" cx="{cx}" cy="{cy}" r="2.5">'
                    f"<title>{name} · {label} {format_number(x)}: {format_number(y)}</title>"
                    "</circle>"
                )
    return _frame(title, y_label, body, legend, top)


def bar_chart(
    labels: Sequence[str], series: Sequence[Series], title: str, y_label: str = ""
) -> Markup:
    """Bars per label (x of each point is the label's index), grouped by series."""
    ys = [y for s in series for _, y in s.points if y is not None]
    if not labels or not ys:
        return line_chart([], title, y_label=y_label)
    legend, top = _legend([s.name for s in series])
    y_ticks = ticks(min(0.0, min(ys)), max(0.0, max(ys)))
    y0, y1 = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - top - BOTTOM
    slot = plot_w / len(labels)
    bar = max(1.0, slot * 0.8 / max(1, len(series)))

    def py(y: float) -> float:
        return top + plot_h - plot_h * (y - y0) / (y1 - y0)

    body = _y_grid(y_ticks, py)
    step = max(1, math.ceil(len(labels) / 12))
    for i, label in enumerate(labels):
        if i % step == 0:
            short = label if len(label) <= 12 else label[:11] + "…"
            x, y = LEFT + slot * (i + 0.5), HEIGHT - BOTTOM + 16
            body.append(f'<text class="tick x" x="{x:.1f}" y="{y}">{escape(short)}</text>')
    for j, s in enumerate(series):
        for x, y in s.points:
            if y is None:
                continue
            left = LEFT + slot * (x + 0.1) + bar * j
            top, bottom = sorted((py(y), py(0.0)))
            body.append(
                f'<rect class="bar s{j % COLOURS}" x="{left:.1f}" y="{top:.1f}" width="{bar:.1f}" '
                f'height="{max(bottom - top, 0.5):.1f}"><title>{escape(s.name)} · '
                f"{escape(labels[int(x)])}: {format_number(y)}</title></rect>"
            )
    return _frame(title, y_label, body, legend, top)
