"""SVG charts drawn here, with no library and no script: line charts over steps (or any number)
and bar charts over labels. Every point carries a <title> with its exact value."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

WIDTH, HEIGHT = 520, 210
LEFT, RIGHT, TOP, BOTTOM = 52, 14, 26, 30
COLOURS = 6
"""Series colours are CSS classes s0..s5 (static/ui.css)."""


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


def _frame(title: str, body: list[str], legend: list[str]) -> Markup:
    label = escape(title)
    return Markup(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{label}">'
        f"<title>{label}</title>{''.join(legend)}{''.join(body)}</svg>"
    )


def _legend(names: Sequence[str]) -> list[str]:
    out, x = [], LEFT
    for i, name in enumerate(names):
        out.append(
            f'<rect class="swatch s{i % COLOURS}" x="{x}" y="8" width="10" height="10"/>'
            f'<text class="legend" x="{x + 14}" y="17">{escape(name)}</text>'
        )
        x += 24 + 7 * len(name)
    return out


def _y_grid(values: Sequence[float], py: Callable[[float], float]) -> list[str]:
    return [
        f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(t):.1f}" y2="{py(t):.1f}"/>'
        f'<text class="tick y" x="{LEFT - 6}" y="{py(t) + 4:.1f}">{format_number(t)}</text>'
        for t in values
    ]


def line_chart(series: Sequence[Series], title: str, x_label: str = "step") -> Markup:
    drawn = [s for s in series if any(y is not None for _, y in s.points)]
    xs = [x for s in drawn for x, y in s.points if y is not None]
    ys = [y for s in drawn for _, y in s.points if y is not None]
    if not ys:
        return _frame(
            title,
            [f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}">no data yet</text>'],
            [],
        )
    y_ticks = ticks(min(ys), max(ys))
    x_ticks = ticks(min(xs), max(xs))
    if all(float(x).is_integer() for x in xs):
        x_ticks = sorted({round(t) for t in x_ticks})
    x0, x1 = min(x_ticks[0], min(xs)), max(x_ticks[-1], max(xs))
    y0, y1 = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (plot_w * (x - x0) / (x1 - x0) if x1 > x0 else plot_w / 2)

    def py(y: float) -> float:
        return TOP + plot_h - (plot_h * (y - y0) / (y1 - y0) if y1 > y0 else plot_h / 2)

    body = _y_grid(y_ticks, py)
    for t in x_ticks:
        body.append(
            f'<text class="tick x" x="{px(t):.1f}" y="{HEIGHT - BOTTOM + 16}">'
            f"{format_number(t)}</text>"
        )
    body.append(f'<text class="axis" x="{WIDTH - RIGHT}" y="{HEIGHT - 4}">{escape(x_label)}</text>')
    label = escape(x_label)
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
    return _frame(title, body, _legend([s.name for s in series]))


def bar_chart(labels: Sequence[str], series: Sequence[Series], title: str) -> Markup:
    """Bars per label (x of each point is the label's index), grouped by series."""
    ys = [y for s in series for _, y in s.points if y is not None]
    if not labels or not ys:
        return line_chart([], title)
    y_ticks = ticks(min(0.0, min(ys)), max(0.0, max(ys)))
    y0, y1 = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / len(labels)
    bar = max(1.0, slot * 0.8 / max(1, len(series)))

    def py(y: float) -> float:
        return TOP + plot_h - plot_h * (y - y0) / (y1 - y0)

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
    return _frame(title, body, _legend([s.name for s in series]))
