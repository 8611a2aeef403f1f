"""What a run's page shows: `rlbus ui`'s run page and `rlbus report` (which draws the same page
as files), both through rlbus.ui.queries.Queries.run_page. Each is keyed by run
(`{run:String}`); the scores are those of the chosen scorer version (`{version:String}`, '' for
each rollout's newest)."""

from __future__ import annotations

from rlbus.bus.store.reads.common import (
    AT_VERSION,
    ERRORED_ROLLOUTS,
    ROLLOUTS,
    RUN,
    scorer_versions_sql,
)

RUN_WHERE = f"WHERE {RUN}"
RUN_SUMMARY = f"""
SELECT groupUniqArrayIf(env, env != '') AS envs, groupUniqArrayIf(model, model != '') AS models,
       groupUniqArrayIf(harness, harness != '') AS harnesses, {ROLLOUTS} AS rollouts,
       {ERRORED_ROLLOUTS} AS errors, min(ts) AS first_ts, max(ts) AS last_ts,
       (SELECT max(step) FROM train_steps {RUN_WHERE}) AS steps,
       (SELECT count() FROM train_steps {RUN_WHERE}) AS steps_stored
FROM rollouts FINAL {RUN_WHERE}
"""
"""The run's environments, models, harnesses, rollouts, errors, time span and trainer steps."""
SCORER_VERSIONS = scorer_versions_sql(RUN)
"""A run's scorer versions, the one that scored last first."""
REWARD_CURVE = f"SELECT * FROM reward_by_step_at({AT_VERSION}) {RUN_WHERE} ORDER BY step"
"""`reward_by_step` of the run (the compare page's curves too, with version '')."""
HEALTH_POINTS = 240
"""The most points of one health curve: a day's samples, every 15 s, are 5,760; each point is the
highest sample of its span of the run, so a peak is never averaged away."""


def health_curve(column: str, key: str, value: str) -> str:
    """One row per (`key` of the map `column`, span of the run): `minute` (the span's start,
    in minutes since the run's first sample) and `value`, the highest in that span."""
    return f"""
WITH (SELECT min(ts) FROM health_samples {RUN_WHERE}) AS t0,
     (SELECT greatest(dateDiff('millisecond', min(ts), max(ts)) / 1000 / {HEALTH_POINTS}, 1)
      FROM health_samples {RUN_WHERE}) AS span_s
SELECT `{key}`, round(floor(dateDiff('millisecond', t0, ts) / 1000 / span_s) * span_s / 60, 3)
       AS minute, max(v) AS `{value}`
FROM health_samples FINAL ARRAY JOIN mapKeys(`{column}`) AS `{key}`, mapValues(`{column}`) AS v
{RUN_WHERE}
GROUP BY `{key}`, minute ORDER BY `{key}`, minute
"""


RUN_CURVES = {
    "reward": REWARD_CURVE,
    "steps": (
        "SELECT step, loss, grad_norm, entropy, mismatch_kl, lr, num_samples, num_tokens "
        f"FROM train_steps FINAL {RUN_WHERE} ORDER BY step, ts DESC LIMIT 1 BY step"
    ),
    "staleness": f"SELECT * FROM staleness {RUN_WHERE} ORDER BY step",
    "throughput": f"SELECT * FROM throughput {RUN_WHERE} ORDER BY role, policy_version",
    "weights": f"SELECT * FROM weight_updates {RUN_WHERE} ORDER BY version",
    "drops": (
        "SELECT step, dropped_stale, metrics['dropped_zero_signal'] AS dropped_zero_signal, "
        "metrics['dropped_too_long'] AS dropped_too_long, "
        "metrics['errored_rollouts'] AS errored_rollouts "
        f"FROM batches FINAL {RUN_WHERE} ORDER BY step, ts DESC LIMIT 1 BY step"
    ),
    "pass_at_k": (
        f"SELECT env, k, pass_at_k, tasks, rollouts FROM pass_at_k_at({AT_VERSION}) {RUN_WHERE} "
        "ORDER BY env, k"
    ),
    "errors": (
        "SELECT env, stage, kind, errors, last_ts, last_error "
        f"FROM errors_by_kind_at({AT_VERSION}) {RUN_WHERE} ORDER BY errors DESC"
    ),
    "latency": f"SELECT * EXCEPT run_id FROM latency {RUN_WHERE} ORDER BY env",
    "envs": f"SELECT * EXCEPT run_id FROM env_pass_rate_at({AT_VERSION}) {RUN_WHERE} ORDER BY env",
    "versions": SCORER_VERSIONS,
    "memory": health_curve("rss_mib", "process", "mib"),
    "lag": health_curve("lag", "group", "messages"),
    "teachers": (
        "SELECT substring(kl.1, 12) AS env, count() AS steps, argMin(kl.2, step) AS `first KL`, "
        "argMax(kl.2, step) AS `last KL`, min(kl.2) AS `lowest KL` "
        f"FROM batches FINAL ARRAY JOIN metrics AS kl {RUN_WHERE} "
        "AND startsWith(kl.1, 'teacher_kl.') GROUP BY env ORDER BY env"
    ),
    "incidents": (
        "SELECT formatDateTime(ts, '%Y-%m-%d %H:%i:%S') AS `time (UTC)`, incident, process, detail "
        f"FROM incidents FINAL {RUN_WHERE} ORDER BY ts LIMIT 1000"
    ),
}
"""Every curve and table of a run's page (rlbus.ui.figures draws the curves); its health (memory,
lag, incidents) is what `rlbus run` recorded of its processes (rlbus.launch.run_health)."""
