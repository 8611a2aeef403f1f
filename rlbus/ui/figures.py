"""What a run's curves are, from the run page's query results (RUN_CURVES in
rlbus.bus.store.reads.run_page): defined once, drawn as SVG by the run page (rlbus.ui.charts)
and as PNG by `rlbus report` (rlbus.ui.report)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlbus.ui.charts import Series


@dataclass(frozen=True)
class Figure:
    title: str
    x_label: str
    series: list[Series]

    @property
    def has_data(self) -> bool:
        return any(y is not None for s in self.series for _, y in s.points)


def series(rows: list[dict[str, Any]], x: str, columns: dict[str, str]) -> list[Series]:
    """One series per column (column -> its name), over `x`."""
    return [Series(name, [(r[x], r[c]) for r in rows]) for c, name in columns.items()]


def run_figures(data: dict[str, list[dict[str, Any]]]) -> dict[str, Figure]:
    """A run's curves: reward, held-out evaluation, loss, staleness, drops, throughput and weight
    updates."""
    reward, steps, stale = data["reward"], data["steps"], data["staleness"]
    throughput = {
        role: [
            (r["policy_version"], r["tokens_per_s"])
            for r in data["throughput"]
            if r["role"] == role
        ]
        for role in ("inference", "trainer")
    }
    return {
        "reward": Figure(
            "reward by policy version",
            "version",
            series(
                reward,
                "step",
                {
                    "mean_reward": "all",
                    "train_mean_reward": "train",
                    "held_out_mean_reward": "held-out",
                },
            ),
        ),
        "held_out": Figure(
            "held-out evaluation",
            "version",
            series(
                [r for r in reward if r["held_out_rollouts"]],
                "step",
                {"held_out_mean_reward": "mean reward", "held_out_pass_rate": "pass rate"},
            ),
        ),
        "loss": Figure(
            "loss", "step", series(steps, "step", {"loss": "loss", "mismatch_kl": "mismatch KL"})
        ),
        "staleness": Figure(
            "staleness",
            "step",
            series(
                stale,
                "step",
                {"mean_versions_behind": "mean versions behind", "max_versions_behind": "max"},
            ),
        ),
        "drops": Figure(
            "samples dropped",
            "step",
            series(stale, "step", {"dropped_stale": "stale (trainer)"})
            + series(
                data["drops"],
                "step",
                {
                    "dropped_zero_signal": "zero signal",
                    "dropped_too_long": "too long",
                    "errored_rollouts": "errored rollouts",
                },
            ),
        ),
        "throughput": Figure(
            "tokens/s",
            "version",
            [Series(role, points) for role, points in throughput.items()],
        ),
        "weights": Figure(
            "weight update (s)",
            "version",
            series(
                data["weights"],
                "version",
                {
                    "write_s": "trainer write",
                    "first_served_s": "published to first worker serving",
                    "last_served_s": "to last worker",
                },
            ),
        ),
    }
