"""What an evaluation run amounts to, read back from the store: mean reward per reward
function, pass@k over groups, token usage and errors by kind. Read from ClickHouse rather
than from memory so a resumed run reports on all of its rollouts.

Scores are read as the views read them: each rollout's newest score (`latest_scores`), or one
scorer version's scores alone when one is asked for."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import comb

from rlbus.bus.store import Store


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a task with n samples of which c passed (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def landed_scores_sql(where: str) -> str:
    """Counts the scored rollouts matching `where` (a condition both tables can take) whose
    rollout is stored too: what reads scores with their rollouts waits for this count, since a
    rollout's score is on another topic and can reach the store first."""
    return (
        f"SELECT count() FROM scored FINAL WHERE {where} "
        f"AND rollout_id IN (SELECT rollout_id FROM rollouts WHERE {where})"
    )


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
    rows = store.query(
        "SELECT scorer_version, uniqExact(rollout_id), max(ts) AS last FROM scored "
        "WHERE run_id = {run:String} AND env = {env:String} "
        "GROUP BY scorer_version ORDER BY last DESC, scorer_version",
        {"run": run_id, "env": env_id},
    ).rows
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
    rollouts = "run_id = {run:String} AND env = {env:String}"
    scores = "scores_at(version = {version:String})"
    row = store.query(
        f"SELECT count(), uniqExact(task_id), avg(reward) FROM {scores} WHERE {rollouts}", where
    ).rows[0]
    report.rollouts, report.tasks, report.mean_reward = (
        int(row[0]),
        int(row[1]),
        float(row[2] or 0.0),
    )
    counted = store.query(
        f"SELECT scorer_version, count() AS n FROM {scores} WHERE {rollouts} "
        "GROUP BY scorer_version ORDER BY n DESC, scorer_version",
        where,
    ).rows
    report.counted = {str(v): int(n) for v, n in counted}
    for column, target in (("rewards", report.rewards), ("metrics", report.metrics)):
        rows = store.query(
            f"SELECT k, avg(v) FROM {scores} "
            f"ARRAY JOIN mapKeys({column}) AS k, mapValues({column}) AS v "
            f"WHERE {rollouts} AND status = 'ok' GROUP BY k ORDER BY k",
            where,
        ).rows
        target.update({str(k): float(v) for k, v in rows})
    groups = store.query(
        "SELECT count(), countIf(reward >= {threshold:Float64} AND status = 'ok') "
        f"FROM {scores} WHERE {rollouts} GROUP BY task_id",
        {**where, "threshold": pass_threshold},
    ).rows
    if groups:
        smallest = min(int(n) for n, _ in groups)
        ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= smallest]
        report.pass_at = {
            k: sum(pass_at_k(int(n), int(c), k) for n, c in groups) / len(groups) for k in ks
        }
    tokens = store.query(
        f"SELECT sum(prompt_tokens), sum(completion_tokens) FROM rollouts FINAL WHERE {rollouts}",
        where,
    ).rows[0]
    report.prompt_tokens, report.completion_tokens = int(tokens[0] or 0), int(tokens[1] or 0)
    errors = store.query(
        "SELECT if(r.status = 'error', r.error_kind, 'reward') AS kind, count() "
        f"FROM (SELECT rollout_id FROM {scores} WHERE {rollouts} AND status = 'error') AS s "
        "INNER JOIN "
        f"(SELECT rollout_id, status, error_kind FROM rollouts FINAL WHERE {rollouts}) AS r "
        "ON s.rollout_id = r.rollout_id "
        "GROUP BY kind ORDER BY kind",
        where,
    ).rows
    report.errors = {str(kind) or "unknown": int(n) for kind, n in errors}
    return report


def scored_tasks(store: Store, run_id: str, env_id: str) -> set[str]:
    """Tasks of a run whose every rollout is scored (errored ones included, by any scorer
    version): what --resume skips."""
    rows = store.query(
        "SELECT task_id FROM scored WHERE run_id = {run:String} AND env = {env:String} "
        "GROUP BY task_id HAVING uniqExact(rollout_id) >= max(group_size)",
        {"run": run_id, "env": env_id},
    ).rows
    return {str(r[0]) for r in rows}


def latest_run(store: Store, env_id: str, model: str) -> str | None:
    """The most recent run of `env_id` against `model`, for --resume without --run-id."""
    rows = store.query(
        "SELECT run_id FROM rollouts WHERE env = {env:String} AND model = {model:String} "
        "ORDER BY ts DESC LIMIT 1",
        {"env": env_id, "model": model},
    ).rows
    return str(rows[0][0]) if rows else None
