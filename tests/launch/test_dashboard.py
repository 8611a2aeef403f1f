"""The live table `rlbus run` shows (rlbus.launch.dashboard), read from a real store."""

from __future__ import annotations

import math
from pathlib import Path

from rlbus.bus.store import open_store
from rlbus.launch.dashboard import figures
from rlbus.schemas.events import TrainStep


def test_mismatch_kl_without_fresh_samples_shows_the_off_policy_kl(tmp_path: Path) -> None:
    """A step whose samples all came from older versions has no mismatch KL (NaN in the
    store); the table says so and shows the older samples' divergence instead of `nan`."""
    steps = [
        TrainStep(run_id="r", step=1, loss=0.5, mismatch_kl=2.5e-13, num_samples=8),
        TrainStep(
            run_id="r",
            step=2,
            loss=0.4,
            mismatch_kl=math.nan,
            num_samples=8,
            metrics={"off_policy_kl": 3.1e-3},
        ),
    ]
    with open_store(f"chdb://{tmp_path / 'store'}") as store:
        store.insert_events(steps[:1], [(0, 0)])
        assert figures(store, "r")["mismatch KL"] == "2.50e-13"
        store.insert_events(steps[1:], [(0, 1)])
        shown = figures(store, "r")["mismatch KL"]
    assert "nan" not in shown
    assert shown == "no samples of v1 (older samples: 3.10e-03)"
