"""What a run's curves are, from the run page's query results (RUN_CURVES in
rlbus.bus.store.reads.run_page): defined once, drawn as SVG by the run page (rlbus.ui.charts)
and as PNG by `rlbus report` (rlbus.ui.report). Each says what it shows (its title) and what
its y axis measures in which unit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlbus.ui.charts import Series

TABLES = {
    "reward": "Reward by version",
    "envs": "Environments",
    "pass_at_k": "pass@k",
    "errors": "Errors by kind",
    "latency": "Latency (seconds)",
    "teachers": "Teachers (KL of the policy to each environment's, on its samples, by step)",
    "incidents": "Incidents (roles exited or restarted, broker rotations)",
}
"""A run's tables by the run page's query result each shows, with its heading: the run page
shows them all, `rlbus report` those after its summary (rlbus.ui.report.REPORTED)."""

HEALTH = ("memory", "lag")
"""The curves of a run's health samples, which only `rlbus run` records: drawn when they have
data (a run of `rlbus worker` processes never will, and an empty chart would say it might)."""


@dataclass(frozen=True)
class Figure:
    title: str
    x_label: str
    y_label: str
    """What the y axis measures ("resident memory")."""
    unit: str
    """Its unit ("MiB"), always said: a number without one reads as anything."""
    series: list[Series]

    @property
    def y_axis(self) -> str:
        return f"{self.y_label} ({self.unit})"

    @property
    def has_data(self) -> bool:
        return any(y is not None for s in self.series for _, y in s.points)


def series(rows: list[dict[str, Any]], x: str, columns: dict[str, str]) -> list[Series]:
    """One series per column (column -> its name), over `x`."""
    return [Series(name, [(r[x], r[c]) for r in rows]) for c, name in columns.items()]


def by_name(rows: list[dict[str, Any]], name: str, x: str, y: str) -> list[Series]:
    """One series per distinct value of column `name` (rows ordered by it, then by `x`)."""
    found: dict[str, list[tuple[float, float | None]]] = {}
    for r in rows:
        found.setdefault(r[name], []).append((r[x], r[y]))
    return [Series(key, points) for key, points in found.items()]


def run_figures(data: dict[str, list[dict[str, Any]]]) -> dict[str, Figure]:
    """A run's curves: reward, held-out evaluation, loss, staleness, drops, throughput, weight
    updates, and, when `rlbus run` sampled them, memory by process and lag by consumer group."""
    reward, steps, stale = data["reward"], data["steps"], data["staleness"]
    throughput = {
        role: [
            (r["policy_version"], r["tokens_per_s"])
            for r in data["throughput"]
            if r["role"] == role
        ]
        for role in ("inference", "trainer")
    }
    figures = {
        "reward": Figure(
            "Reward by policy version",
            "version",
            "mean reward",
            "score",
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
            "Held-out evaluation by policy version",
            "version",
            "mean reward (score) and pass rate",
            "0-1",
            series(
                [r for r in reward if r["held_out_rollouts"]],
                "step",
                {"held_out_mean_reward": "mean reward", "held_out_pass_rate": "pass rate"},
            ),
        ),
        "loss": Figure(
            "Training loss and trainer-inference mismatch",
            "step",
            "mean per token",
            "loss; KL in nats",
            series(steps, "step", {"loss": "loss", "mismatch_kl": "mismatch KL"}),
        ),
        "staleness": Figure(
            "Staleness of the samples trained on",
            "step",
            "behind the trained policy",
            "versions",
            series(
                stale,
                "step",
                {"mean_versions_behind": "mean versions behind", "max_versions_behind": "max"},
            ),
        ),
        "drops": Figure(
            "Left out of training, per step",
            "step",
            "dropped",
            "count",
            series(stale, "step", {"dropped_stale": "stale samples (trainer)"})
            + series(
                data["drops"],
                "step",
                {
                    "dropped_zero_signal": "zero-signal groups",
                    "dropped_too_long": "too-long samples",
                    "errored_rollouts": "errored rollouts",
                },
            ),
        ),
        "throughput": Figure(
            "Throughput by policy version",
            "version",
            "throughput",
            "tokens/s",
            [Series(role, points) for role, points in throughput.items()],
        ),
        "weights": Figure(
            "Weight update time by version",
            "version",
            "time",
            "s",
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
        "memory": Figure(
            "Memory by process",
            "minutes since the first sample",
            "resident memory",
            "MiB",
            by_name(data["memory"], "process", "minute", "mib"),
        ),
        "lag": Figure(
            "Consumer lag by group",
            "minutes since the first sample",
            "consumer lag",
            "messages",
            by_name(data["lag"], "group", "minute", "messages"),
        ),
    }
    return {
        name: figure for name, figure in figures.items() if name not in HEALTH or figure.has_data
    }
