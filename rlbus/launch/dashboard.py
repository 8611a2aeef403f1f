"""The live table `rlbus run` shows, read from the store while the sink holds it (the SQL is
rlbus.bus.store.reads.dashboard's)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from rich.table import Table

from rlbus.bus.store import Store, open_store
from rlbus.bus.store.reads.dashboard import HELD_OUT, LATEST_STEP, SERVED, TRAIN_REWARD


@dataclass
class Dashboard:
    run_id: str
    url: str
    started: float = field(default_factory=time.monotonic)
    refreshed: float = 0.0
    figures: dict[str, str] = field(default_factory=dict)

    def refresh(self) -> Table:
        self.refreshed = time.monotonic()
        try:
            with open_store(self.url, read_only=True) as store:
                self.figures = figures(store, self.run_id)
        except Exception as exc:
            self.figures.setdefault("store", f"waiting ({type(exc).__name__})")
        elapsed = time.monotonic() - self.started
        table = Table(title=f"rlbus run {self.run_id} · {elapsed:,.0f}s", show_header=False)
        for name, val in self.figures.items():
            table.add_row(name, val)
        return table


def figures(store: Store, run_id: str) -> dict[str, str]:
    p = {"run": run_id}
    step = store.query(LATEST_STEP, p).rows
    reward = store.query(TRAIN_REWARD, p).rows
    evals = store.query(HELD_OUT, p).rows
    served = store.query(SERVED, p).rows
    out = {"store": "ok"}
    if step:
        s, loss, gn, ent, kl, older_kl, tps, n, dropped, staleness = step[0]
        out |= {
            "step": str(s),
            "loss": f"{loss:.4f}",
            "grad norm": f"{gn:.3f}",
            "entropy": f"{ent:.3f}",
            "mismatch KL": mismatch_kl(s, kl, older_kl),
            "trainer tokens/s": f"{tps:,.0f}",
            "samples/step": str(n),
            "staleness (versions behind: samples)": str(dict(staleness)),
            "dropped stale (last step)": str(dropped),
        }
    if reward and reward[0][2]:
        out["train reward (last 256 rollouts)"] = f"{reward[0][1]:.3f} (up to v{reward[0][0]})"
    if served and served[0][0] is not None:
        out["inference serves"] = f"v{served[0][0]}"
    if evals:
        out["held-out pass rate"] = "  ".join(f"v{v}: {rate:.2f}" for v, rate, _ in evals[-6:])
    return out


def mismatch_kl(step: int, kl: float, older_kl: float) -> str:
    """The trainer's mismatch KL is measured on samples of the version it trains (step N trains
    version N-1); an async step often has none (NaN in the store), and then the older samples'
    divergence is what there is."""
    if math.isnan(kl):
        return f"no samples of v{step - 1} (older samples: {older_kl:.2e})"
    return f"{kl:.2e}"
