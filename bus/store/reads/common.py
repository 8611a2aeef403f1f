"""Queries and conditions more than one reader runs: each written once here."""

from __future__ import annotations

RUN = "run_id = {run:String}"
"""One run's rows."""
RUN_ENV = f"{RUN} AND env = {{env:String}}"
"""One run's rows of one environment."""
AT_VERSION = "version = {version:String}"
"""The score views' choice ('' = each rollout's newest score): `NAME_at(version = ...)`."""

ROLLOUTS = "uniqExact(rollout_id)"
"""How many rollouts: a rollout stored with two contents (its task rolled out again under the
same ids after a crash; the conflicts view lists it) is one rollout."""
ERRORED_ROLLOUTS = "uniqExactIf(rollout_id, status != 'ok')"
"""How many of them failed (ROLLOUTS)."""


def rollouts_once(where: str, columns: str) -> str:
    """A subquery of `columns` of the rollouts matching `where`, one row per rollout: a rollout
    stored with two contents reads as its newest, as its own page shows it (ROLLOUTS)."""
    return (
        f"(SELECT {columns} FROM rollouts FINAL WHERE {where} "
        "ORDER BY ts DESC LIMIT 1 BY rollout_id)"
    )


FINAL_STEP = (
    "SELECT count() FROM train_steps FINAL WHERE run_id = {run:String} AND step = {step:UInt32}"
)
"""Whether a run's given step is in the store (a run is over when its last step has landed):
what `rlbus run` (the supervisor) and the in-process runner wait for."""


def landed_scores(where: str) -> str:
    """Counts the scored rollouts matching `where` (a condition both tables can take) whose
    rollout is stored too: what reads scores with their rollouts waits for this count, since a
    rollout's score is on another topic and can reach the store first (`rlbus eval`, the
    recipe's scripted answers)."""
    return (
        f"SELECT count() FROM scored FINAL WHERE {where} "
        f"AND rollout_id IN (SELECT rollout_id FROM rollouts WHERE {where})"
    )


def scorer_versions_sql(where: str) -> str:
    """The scorer versions of the scores matching `where`, the one that scored last first: each
    with the rollouts it scored and its last score's time (the ui's run page, the eval
    summary)."""
    return f"""
SELECT scorer_version, uniqExact(rollout_id) AS rollouts, max(ts) AS last_ts FROM scored
WHERE {where} GROUP BY scorer_version ORDER BY last_ts DESC, scorer_version
"""


TEST_SPLIT = f"{RUN} AND JSONExtractString(info, 'split') = 'test'"
"""A run's held-out rollouts (the orchestrator's evaluations, tasks never trained on)."""
TRAIN_SPLIT = f"{RUN} AND JSONExtractString(info, 'split') = 'train'"
"""A run's training rollouts."""


def held_out_by_version(columns: str) -> str:
    """`columns` (over `s`, the scores) of a run's held-out rollouts (split 'test' in the
    rollout's info: the orchestrator's evaluations, tasks never trained on), one row per
    evaluated weights version, `version` first (the recipe's figures, `rlbus run`'s
    dashboard)."""
    return f"""
SELECT JSONExtractInt(r.info, 'eval_version') AS version,
       {columns}
FROM scored AS s FINAL
INNER JOIN {rollouts_once(TEST_SPLIT, "rollout_id, info")} AS r ON s.rollout_id = r.rollout_id
WHERE s.run_id = {{run:String}}
GROUP BY version ORDER BY version
"""
