"""`rlbus report RUN`: one self-contained HTML file (every plot a base64 PNG, nothing fetched) and
the PNGs, one per curve of the run page that has data, from a real store."""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rlbus.bus.store import open_store
from rlbus.commands.report import register
from rlbus.schemas import (
    RolloutCompleted,
    RolloutScored,
    TokenRecord,
    TrainBatch,
    TrainStep,
    WeightLoaded,
    WeightVersion,
    derived_id,
)
from rlbus.schemas.packed import pack_tokens

PNG = b"\x89PNG\r\n\x1a\n"
CURVES = {"reward", "held_out", "loss", "staleness", "drops", "throughput", "weights"}


def run_events(run: str, train: bool) -> list[list]:
    """Rollouts sampled by versions 0-2 (every fourth held out), their scores and timed model
    calls; with `train`, two train steps, their batches and their weights, published and loaded."""
    rollouts, scores, records = [], [], []
    for version in range(3):
        for i in range(4):
            rollout = derived_id(run, version, i)
            held_out = i == 3
            common = {
                "run_id": run,
                "rollout_id": rollout,
                "group_id": derived_id(run, version),
                "task_id": f"t{version}-{i}",
                "env": "reverse_text",
                "sample_index": i,
                "group_size": 4,
            }
            rollouts.append(
                RolloutCompleted(
                    **common,
                    info={"split": "test"} if held_out else {},
                    min_policy_version=version,
                    max_policy_version=version,
                    duration_s=0.5,
                )
            )
            scores.append(
                RolloutScored(**common, reward=version / 2 + i / 10, policy_version=version)
            )
            records.append(
                TokenRecord(
                    run_id=run,
                    rollout_id=rollout,
                    completion_ids=pack_tokens([1, 2, 3, 4]),
                    policy_version=version,
                    duration_s=0.25,
                    ts=1.7e9 + version * 10 + i,
                )
            )
    events = [rollouts, scores, records]
    if train:
        events.append(
            [
                TrainStep(
                    run_id=run,
                    step=step,
                    loss=1.0 / step,
                    num_samples=8,
                    num_tokens=256,
                    tokens_per_s=1000.0,
                    staleness={"0": 6, "1": 2},
                    dropped_stale=step - 1,
                    metrics={"step_s": 0.256, "weights_write_s": 0.05, "weights_mb": 5.0},
                )
                for step in (1, 2)
            ]
        )
        events.append(
            [
                WeightVersion(run_id=run, ts=1.7e9 + step, version=step, uri=f"v{step}")
                for step in (1, 2)
            ]
        )
        events.append(
            [
                WeightLoaded(
                    run_id=run, ts=1.7e9 + step + 0.1, version=step, worker_id="w", load_s=0.05
                )
                for step in (1, 2)
            ]
        )
        events.append(
            [
                TrainBatch(
                    run_id=run,
                    batch_id=derived_id(run, "batch", step),
                    step=step,
                    metrics={"dropped_zero_signal": 2.0, "dropped_too_long": 0.0},
                )
                for step in (1, 2)
            ]
        )
    return events


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"chdb://{tmp_path / 'store'}"
    with open_store(url) as store:
        for n, events in enumerate([*run_events("rl", True), *run_events("ev", False)]):
            store.insert_events(events, [(0, 1000 * n + i) for i in range(len(events))], str(n))
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
