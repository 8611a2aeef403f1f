"""Every chart of a run's page and of `rlbus report` says what it shows and in which unit: a title,
and a y-axis label that names its unit in parentheses, read from what each emits. The run here
has every curve: training, and the memory and lag `rlbus run` samples."""

from __future__ import annotations

import html
import re
from pathlib import Path

import httpx
import pytest
from support.stored_runs import ROTATION, health_events, run_events, store_events

from rlbus.bus.server_thread import ServerThread
from rlbus.ui.app import create_app
from rlbus.ui.figures import run_figures
from rlbus.ui.queries import Queries
from rlbus.ui.report import draw, pyplot
from rlbus.ui.source import StoreSource

CHARTS = {
    "reward",
    "held_out",
    "loss",
    "staleness",
    "drops",
    "throughput",
    "weights",
    "memory",
    "lag",
}
UNIT = re.compile(r"\(([^()]+)\)$")
"""A y-axis label ends with its unit in parentheses: 'resident memory (MiB)'."""


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"chdb://{tmp_path / 'store'}"
    store_events(url, [*run_events("rl", True), *health_events("rl")])
    return url


def test_every_chart_of_the_run_page_has_a_title_and_a_y_axis_with_its_unit(url: str) -> None:
    with ServerThread(create_app(url), lifespan="on") as ui:
        page = httpx.get(f"{ui.url}/runs/rl", timeout=60)
    assert page.status_code == 200, page.text[-2000:]
    figures = dict(re.findall(r'<figure id="chart-([\w-]+)">(.*?)</figure>', page.text, re.S))
    assert set(figures) == CHARTS
    for name, svg in figures.items():
        title = re.search(r'<text class="title"[^>]*>([^<]+)</text>', svg)
        y_axis = re.search(r'<text class="axis y"[^>]*>([^<]+)</text>', svg)
        assert title and title.group(1).strip(), f"chart {name} has no title"
        assert y_axis and UNIT.search(y_axis.group(1)), f"chart {name}'s y axis names no unit"
    memory = figures["memory"]
    assert ">Memory by process</text>" in memory and ">resident memory (MiB)</text>" in memory
    # The highest sample of each span (here one sample a span), by process, in MiB.
    assert "broker · minutes since the first sample 2: 128</title>" in memory
    assert "judge.rl.reverse_text · minutes since the first sample 1: 40</title>" in figures["lag"]
    incidents = re.search(r'<table class="nav" id="incidents-table">.*?</table>', page.text, re.S)
    assert incidents is not None
    row = re.sub(r"<[^>]+>", " ", incidents.group(0))
    assert "broker-rotation" in row and html.escape(ROTATION) in row


def test_every_figure_of_the_report_has_a_title_and_a_y_axis_with_its_unit(url: str) -> None:
    source = StoreSource(url, "test")
    queries = Queries(source)
    try:
        _, data = queries.run_page("rl")
    finally:
        queries.close()
        source.close()
    figures = run_figures(data)
    assert set(figures) == CHARTS
    plt = pyplot()
    for name, figure in figures.items():
        fig, ax = plt.subplots()
        try:
            draw(ax, figure)
            assert ax.get_title(), f"figure {name} has no title"
            assert UNIT.search(ax.get_ylabel()), f"figure {name}'s y axis names no unit"
        finally:
            plt.close(fig)
