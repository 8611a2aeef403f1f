"""What `rlbus ui` reads besides a run's page (reads/run_page.py): the runs list, the run menu,
the rollouts table and its filters, a rollout's page, the compare page. The SQL text is fixed
(a filter adds a fixed condition); whatever a user typed travels only as a `{name:Type}`
parameter value, never as SQL. The console runs the user's own SQL (through the store's
read-only path), so it has none here."""

from __future__ import annotations

from rlbus.bus.store.reads.common import ERRORED_ROLLOUTS, ROLLOUTS, RUN

# -- runs ----------------------------------------------------------------------------

RUNS_ROLLOUTS = f"""
SELECT run_id, groupUniqArrayIf(8)(env, env != '') AS envs,
       groupUniqArrayIf(4)(model, model != '') AS models,
       {ROLLOUTS} AS rollouts, {ERRORED_ROLLOUTS} AS errors,
       min(ts) AS first_ts, max(ts) AS last_ts
FROM rollouts FINAL GROUP BY run_id
"""
RUNS_STEPS = (
    "SELECT run_id, max(step) AS steps, max(ts) AS last_step_ts FROM train_steps GROUP BY run_id"
)
RUNS_REWARD = """
SELECT run_id, argMax(mean_reward, step) AS latest_reward, max(step) AS latest_version
FROM (
    SELECT run_id, policy_version AS step, avgIf(reward, status = 'ok') AS mean_reward
    FROM latest_scores FINAL GROUP BY run_id, step
)
GROUP BY run_id
"""
"""reward_by_step's mean_reward at each run's newest version (each rollout's newest score),
without the view's join (the runs page reads every run)."""
RUN_IDS = "SELECT run_id, max(ts) AS last FROM rollouts GROUP BY run_id ORDER BY last DESC"
"""The run menu, the most recent run first."""

# -- rollouts ------------------------------------------------------------------------

CHOICES = """
SELECT
    (SELECT groupUniqArray(toString(env)) FROM rollouts WHERE 1 {scope}) AS envs,
    (SELECT groupUniqArray(if(error_kind = '', 'unknown', toString(error_kind))) FROM rollouts
     WHERE status != 'ok' {scope}) AS kinds
"""


def choices(of_run: bool) -> str:
    """The filters' choices (environments, error kinds) in one round trip, of one run
    (`{run:String}`) or of all."""
    return CHOICES.format(scope=f"AND {RUN}" if of_run else "")


ROLLOUT_COLUMNS = (
    "rollout_id, run_id, env, task_id, sample_index, status, error_kind, model, num_turns, "
    "completion_tokens, min_policy_version, max_policy_version, duration_s, ts"
)
"""The rollouts table's columns."""

# The rollouts table's filters: each a fixed condition over `rollouts` with its parameter.
BY_RUN = RUN
BY_ENV = "env = {env:String}"
BY_VERSION = "{version:Int64} BETWEEN min_policy_version AND max_policy_version"
"""Rollouts sampled (in part) at a policy version."""
SCORING_FAILED = (
    "status = 'ok' AND rollout_id IN (SELECT rollout_id FROM scored WHERE status != 'ok')"
)
"""Rollouts that finished but whose scoring failed (error kind 'reward')."""
BY_ERROR_KIND = "status != 'ok' AND error_kind = {error_kind:String}"
BY_TEXT = (
    "(rollout_id = {text:String} OR task_id = {text:String} "
    "OR positionCaseInsensitiveUTF8(completion, {text:String}) > 0 "
    "OR positionCaseInsensitiveUTF8(prompt, {text:String}) > 0)"
)
"""A rollout or task id, or text in the prompt or completion (case-insensitive)."""
MIN_REWARD = "reward >= {min_reward:Float64}"
MAX_REWARD = "reward <= {max_reward:Float64}"
AFTER = "rollout_id > {after:String}"
BEFORE = "rollout_id < {before:String}"


def scored_within(bounds: list[str], of_run: bool) -> str:
    """Rollouts with a score within `bounds` (MIN_REWARD, MAX_REWARD), looked up in one run's
    scores when `of_run`."""
    scope = f" AND {RUN}" if of_run else ""
    return f"rollout_id IN (SELECT rollout_id FROM scored WHERE {' AND '.join(bounds)}{scope})"


def rollouts_page(conditions: list[str], backwards: bool, limit: int) -> str:
    """Up to `limit` rows matching every condition, in rollout_id order (the table's ORDER BY
    key, so a cursor condition, AFTER or BEFORE, stops the read early), descending when
    `backwards`."""
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    return (
        f"SELECT {ROLLOUT_COLUMNS} FROM rollouts {where} "
        f"ORDER BY rollout_id {'DESC' if backwards else ''} LIMIT {limit}"
    )


LATEST_SCORES = """
SELECT rollout_id, argMax(reward, ts) AS reward, argMax(status, ts) AS score_status,
       count() AS scores
FROM scored WHERE rollout_id IN {ids:Array(String)} GROUP BY rollout_id
"""
"""A page's rewards: each rollout's latest score, and how many it has (scorer versions)."""

# -- a rollout -----------------------------------------------------------------------

ROLLOUT = """
SELECT * EXCEPT (kafka_partition, kafka_offset) FROM rollouts FINAL
WHERE rollout_id = {id:String} ORDER BY ts DESC LIMIT 1
"""
SCORES = """
SELECT * EXCEPT (kafka_partition, kafka_offset, rollout_id, group_id, task_id, env, sample_index,
                 group_size, schema_version, run_id)
FROM scored FINAL WHERE rollout_id = {id:String} ORDER BY ts
"""
"""Every score of a rollout (each scorer version its own row)."""
OF_ROLLOUT = "rollout_id = {id:String}"
"""A rollout's trace nodes and token records (`read_events`)."""

# -- compare -------------------------------------------------------------------------

SHARED_TASKS = """
SELECT task_id FROM (
    SELECT DISTINCT task_id FROM rollouts WHERE run_id = {a:String}
    INTERSECT
    SELECT DISTINCT task_id FROM rollouts WHERE run_id = {b:String}
)
ORDER BY task_id LIMIT 200
"""
"""The tasks two runs share."""
TASK_ROLLOUTS = """
SELECT r.rollout_id AS rollout_id, r.sample_index AS sample_index, r.status AS status,
       r.error AS error, r.prompt AS prompt, r.completion AS completion,
       r.min_policy_version AS version, s.reward AS reward
FROM (
    SELECT * FROM rollouts FINAL WHERE run_id = {run:String} AND task_id = {task:String}
    ORDER BY ts DESC LIMIT 1 BY rollout_id
) AS r
LEFT JOIN (
    SELECT rollout_id, argMax(reward, ts) AS reward FROM scored
    WHERE run_id = {run:String} AND task_id = {task:String} GROUP BY rollout_id
) AS s ON r.rollout_id = s.rollout_id
ORDER BY version, sample_index
"""
"""A run's rollouts of one task, each with its newest reward. A rollout stored with two
contents (its task rolled out again after a crash: the conflicts view) shows its newest, as its
own page does (ROLLOUT)."""
