"""What an evaluation run amounts to, read back from the store: mean reward per reward
function, pass@k over groups, token usage and errors by kind. Read from ClickHouse rather
than from memory so a resumed run reports on all of its rollouts.

Scores are read as the views read them: each rollout's newest score (`latest_scores`), or one
scorer version's scores alone when one is asked for. The SQL is
rlbus.bus.store.reads.eval_summary's."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import comb

from rlbus.bus.store import Store
from rlbus.bus.store.reads.eval_summary import (
    COUNTED,
    ERRORS,
    LATEST_RUN,
    MEANS,
    PASSED_BY_TASK,
    SCORED_TASKS,
    SCORER_VERSIONS,
    TOKENS,
    TOTALS,
)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a task with n samples of which c passed (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class EvalSummary:
    run_id: str
    scorer_version: str = ""
    """The version asked for; '' for each rollout's newest score."""
    versions: dict[str, int] = field(default_factory=dict)
    """Every scorer version of the run and environment, newest first, with its scored rollouts."""
    counted: dict[str, int] = field(default_factory=dict)
    """The versions of the scores this report counts, with their rollouts."""
    rollouts: int = 0
    tasks: int = 0
    mean_reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)
    """Mean of each reward function over rollouts scored without error."""
    metrics: dict[str, float] = field(default_factory=dict)
    pass_at: dict[int, float] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)


def scorer_versions(store: Store, run_id: str, env_id: str) -> dict[str, int]:
    """The run and environment's scorer versions, the one that scored last first, with the
    rollouts each scored."""
    rows = store.query(SCORER_VERSIONS, {"run": run_id, "env": env_id}).rows
    return {str(version): int(n) for version, n, _ in rows}


def read_eval_summary(
    store: Store,
    run_id: str,
    env_id: str,
    pass_threshold: float = 1.0,
    version: str | None = None,
) -> EvalSummary:
    """`version`: the scorer version to read (default: each rollout's newest score)."""
    versions = scorer_versions(store, run_id, env_id)
    if version is not None and version not in versions:
        raise KeyError(
            f"run {run_id!r} has no scores of {env_id} by scorer version {version!r}; "
            f"its versions: {', '.join(map(repr, versions)) or 'none'}"
        )
    where = {"run": run_id, "env": env_id, "version": version or ""}
    report = EvalSummary(run_id, version or "", versions)
    row = store.query(TOTALS, where).rows[0]
    report.rollouts, report.tasks, report.mean_reward = (
        int(row[0]),
        int(row[1]),
        float(row[2] or 0.0),
    )
    counted = store.query(COUNTED, where).rows
    report.counted = {str(v): int(n) for v, n in counted}
    for column, target in (("rewards", report.rewards), ("metrics", report.metrics)):
        rows = store.query(MEANS[column], where).rows
        target.update({str(k): float(v) for k, v in rows})
    groups = store.query(PASSED_BY_TASK, {**where, "threshold": pass_threshold}).rows
    if groups:
        smallest = min(int(n) for n, _ in groups)
        ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= smallest]
        report.pass_at = {
            k: sum(pass_at_k(int(n), int(c), k) for n, c in groups) / len(groups) for k in ks
        }
    tokens = store.query(TOKENS, where).rows[0]
    report.prompt_tokens, report.completion_tokens = int(tokens[0] or 0), int(tokens[1] or 0)
    errors = store.query(ERRORS, where).rows
    report.errors = {str(kind) or "unknown": int(n) for kind, n in errors}
    return report


def scored_tasks(store: Store, run_id: str, env_id: str) -> set[str]:
    """Tasks of a run whose every rollout is scored (errored ones included, by any scorer
    version): what --resume skips."""
    rows = store.query(SCORED_TASKS, {"run": run_id, "env": env_id}).rows
    return {str(r[0]) for r in rows}


def latest_run(store: Store, env_id: str, model: str) -> str | None:
    """The most recent run of `env_id` against `model`, for --resume without --run-id."""
    rows = store.query(LATEST_RUN, {"env": env_id, "model": model}).rows
    return str(rows[0][0]) if rows else None
