"""`rlbus report RUN`: one self-contained HTML file (every plot a base64 PNG, nothing fetched) and
the PNGs, one per curve of the run page that has data, from a real store."""

from __future__ import annotations

import base64
import html
import re
import sys
from pathlib import Path

import pytest
import typer
from support.stored_runs import ROTATION, health_events, run_events, store_events
from typer.testing import CliRunner

from rlbus.commands.report import register
from rlbus.schemas import TrainBatch

PNG = b"\x89PNG\r\n\x1a\n"
CURVES = {"reward", "held_out", "loss", "staleness", "drops", "throughput", "weights"}


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"chdb://{tmp_path / 'store'}"
    store_events(url, [*run_events("rl", True), *run_events("ev", False)])
    return url


def report(url: str, *args: str) -> tuple[int, str]:
    app, worker = typer.Typer(), typer.Typer()
    app.add_typer(worker, name="worker")
    register(app, worker)
    result = CliRunner().invoke(app, ["report", *args, "--store.url", url])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.slow
def test_a_training_run_gets_every_curve_in_one_self_contained_file(
    url: str, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    code, output = report(url, "rl", "--out", str(out))
    assert code == 0, output
    html = (out / "report.html").read_text()
    pngs = {p.stem: p.read_bytes() for p in out.glob("*.png")}
    assert set(pngs) == CURVES and all(image.startswith(PNG) for image in pngs.values())
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert sorted(base64.b64decode(e) for e in embedded) == sorted(pngs.values())
    # nothing is fetched: no other source, link, script or address
    assert len(re.findall(r"\bsrc=", html)) == len(embedded)
    assert not re.search(r"<script|<link|https?://|url\(", html)
    assert "run rl" in html and "reverse_text" in html and "pass@k" in html


def test_an_eval_run_gets_the_curves_its_views_have_data_for(url: str, tmp_path: Path) -> None:
    out = tmp_path / "ev"
    code, output = report(url, "ev", "--out", str(out))
    assert code == 0, output
    assert {p.stem for p in out.glob("*.png")} == {"reward", "held_out", "throughput"}


def test_what_rlbus_run_sampled_adds_memory_lag_and_incidents(tmp_path: Path) -> None:
    """A run's health (rlbus.launch.run_health): memory by process and lag by consumer group as
    curves, and its incidents as a table, with their times."""
    url = f"chdb://{tmp_path / 'store'}"
    store_events(url, [*run_events("ev", False), *health_events("ev")])
    out = tmp_path / "ev"
    code, output = report(url, "ev", "--out", str(out))
    assert code == 0, output
    assert {p.stem for p in out.glob("*.png")} == {
        "reward",
        "held_out",
        "throughput",
        "memory",
        "lag",
    }
    page = (out / "report.html").read_text()
    assert 'alt="Memory by process: resident memory (MiB)"' in page
    incidents = page.split("<h2>Incidents")[1]
    assert "broker-rotation" in incidents and html.escape(ROTATION) in incidents
    assert "2023-11-14 22:14:21" in incidents  # 1.7e9 + 61 s, in UTC


def test_a_distilled_run_shows_how_close_it_came_to_each_teacher(url: str, tmp_path: Path) -> None:
    """A student of two teachers (the experts recipe): per environment, the KL of the policy to
    its teacher over the steps that had one, as the orchestrator put it in each batch."""
    kl = {"reverse_text": (0.9, 0.6, 0.4), "chain_sum": (1.5, 1.1, 1.2)}
    batches = [
        TrainBatch(
            run_id="student",
            batch_id=f"b{step}",
            step=step,
            metrics={f"teacher_kl.{env}": values[step - 1] for env, values in kl.items()},
        )
        for step in (1, 2, 3)
    ]
    url = f"chdb://{tmp_path / 'store'}"
    store_events(url, [*run_events("rl", True), *run_events("student", True), batches])
    code, output = report(url, "student", "--out", str(tmp_path / "student"))
    assert code == 0, output
    page = (tmp_path / "student" / "report.html").read_text()
    teachers = page.split("<h2>Teachers")[1].split("<h2>")[0]
    rows = re.findall(r"<tr>(.*?)</tr>", teachers)[1:]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    assert cells == [
        ["chain_sum", "3", "1.5", "1.2", "1.1"],
        ["reverse_text", "3", "0.9", "0.4", "0.4"],
    ]
    code, _ = report(url, "rl", "--out", str(tmp_path / "rl"))
    assert "no rows" in (tmp_path / "rl" / "report.html").read_text().split("<h2>Teachers")[1]


def test_an_unknown_run_is_named_with_the_runs_there_are(url: str, tmp_path: Path) -> None:
    code, output = report(url, "nope", "--out", str(tmp_path / "x"))
    assert code == 2 and "no run 'nope'" in output and "rl" in output
    assert not (tmp_path / "x").exists()


def test_without_matplotlib_it_says_how_to_install_it(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    code, output = report(url, "rl", "--out", str(tmp_path / "x"))
    assert code == 2 and "pip install 'rlbus[plots]'" in output
