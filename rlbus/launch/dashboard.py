"""The live table `rlbus run` shows, read from the store while the sink holds it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from rich.table import Table

from rlbus.bus.store import Store, open_store

LATEST_STEP = (
    "SELECT step, loss, grad_norm, entropy, mismatch_kl, metrics['off_policy_kl'], tokens_per_s, "
    "num_samples, dropped_stale, staleness FROM train_steps FINAL WHERE run_id = {run:String} "
    "ORDER BY step DESC LIMIT 1"
)
TRAIN_REWARD = (
    "SELECT max(policy_version), avgIf(reward, status = 'ok'), count() FROM ("
    "SELECT policy_version, reward, status FROM scored FINAL WHERE run_id = {run:String} "
    "AND rollout_id IN (SELECT rollout_id FROM rollouts WHERE run_id = {run:String} "
    "AND JSONExtractString(info, 'split') = 'train') ORDER BY ts DESC LIMIT 256)"
)
HELD_OUT = (
    "SELECT JSONExtractInt(r.info, 'eval_version') AS v, avg(s.reward >= 1), count() "
    "FROM scored AS s FINAL INNER JOIN (SELECT rollout_id, info FROM rollouts FINAL "
    "WHERE run_id = {run:String} AND JSONExtractString(info, 'split') = 'test') AS r "
    "ON s.rollout_id = r.rollout_id WHERE s.run_id = {run:String} GROUP BY v ORDER BY v"
)
SERVED = "SELECT max(version) FROM weights_loaded FINAL WHERE run_id = {run:String}"


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


FINAL_STEP = (
    "SELECT count() FROM train_steps FINAL WHERE run_id = {run:String} AND step = {step:UInt32}"
)
"""Whether a run's given step is in the store (a run is over when its last step has landed)."""
