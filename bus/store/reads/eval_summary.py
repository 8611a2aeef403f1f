"""What an evaluation's summary reads (rlbus.launch.eval_summary: `rlbus eval`, `rlbus rescore`):
one run's rollouts of one environment (`RUN_ENV`), their scores as the views read them
(`scores_at`: each rollout's newest score, or one scorer version's alone)."""

from __future__ import annotations

from rlbus.bus.store.reads.common import (
    AT_VERSION,
    RUN_ENV,
    landed_scores,
    rollouts_once,
    scorer_versions_sql,
)

SCORES = f"scores_at({AT_VERSION})"
"""The scores the summary counts."""

SCORED = landed_scores(RUN_ENV)
"""The run and environment's scores whose rollouts are stored too: what `rlbus eval` waits for
before it reads the summary."""
SCORER_VERSIONS = scorer_versions_sql(RUN_ENV)
"""The run and environment's scorer versions, the one that scored last first, with the
rollouts each scored."""
TOTALS = f"SELECT count(), uniqExact(task_id), avg(reward) FROM {SCORES} WHERE {RUN_ENV}"
"""Rollouts, tasks and mean reward."""
COUNTED = (
    f"SELECT scorer_version, count() AS n FROM {SCORES} WHERE {RUN_ENV} "
    "GROUP BY scorer_version ORDER BY n DESC, scorer_version"
)
"""The versions of the scores counted, with their rollouts."""
MEANS = {
    column: (
        f"SELECT k, avg(v) FROM {SCORES} "
        f"ARRAY JOIN mapKeys({column}) AS k, mapValues({column}) AS v "
        f"WHERE {RUN_ENV} AND status = 'ok' GROUP BY k ORDER BY k"
    )
    for column in ("rewards", "metrics")
}
"""The mean of each reward function (`rewards`) and metric (`metrics`) over rollouts scored
without error."""
PASSED_BY_TASK = (
    "SELECT count(), countIf(reward >= {threshold:Float64} AND status = 'ok') "
    f"FROM {SCORES} WHERE {RUN_ENV} GROUP BY task_id"
)
"""Each task's rollouts and how many passed (pass@k's n and c)."""
TOKENS = (
    "SELECT sum(prompt_tokens), sum(completion_tokens) "
    f"FROM {rollouts_once(RUN_ENV, 'prompt_tokens, completion_tokens')}"
)
ERRORS = (
    "SELECT if(r.status = 'error', r.error_kind, 'reward') AS kind, count() "
    f"FROM (SELECT rollout_id FROM {SCORES} WHERE {RUN_ENV} AND status = 'error') AS s "
    "INNER JOIN "
    f"{rollouts_once(RUN_ENV, 'rollout_id, status, error_kind')} AS r "
    "ON s.rollout_id = r.rollout_id "
    "GROUP BY kind ORDER BY kind"
)
"""Errored scores by kind: the rollout's error kind, or 'reward' when the rollout was fine and
scoring it failed."""
SCORED_TASKS = (
    f"SELECT task_id FROM scored WHERE {RUN_ENV} "
    "GROUP BY task_id HAVING uniqExact(rollout_id) >= max(group_size)"
)
"""Tasks whose every rollout is scored (by any scorer version): what --resume skips."""
LATEST_RUN = (
    "SELECT run_id FROM rollouts WHERE env = {env:String} AND model = {model:String} "
    "ORDER BY ts DESC LIMIT 1"
)
"""The most recent run of an environment against a model."""
