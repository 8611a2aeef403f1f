"""What the tiny-model recipe reads (rlbus.launch.recipe: `rlbus quickstart`, bench/learning.py,
the learning test). The task sets it is used with have an `exact` reward."""

from __future__ import annotations

from rlbus.bus.store.reads.common import (
    RUN,
    TRAIN_SPLIT,
    held_out_by_version,
    landed_scores,
    rollouts_once,
)

HELD_OUT_SQL = held_out_by_version(
    "round(avg(s.rewards['exact']), 4) AS exact_match,\n"
    "       round(avg(s.reward), 4) AS mean_reward,\n"
    "       count() AS rollouts"
)
"""Held-out exact match and reward per evaluated weights version (tasks never trained on)."""

TRAIN_REWARD_SQL = f"""
SELECT s.policy_version AS version, round(avg(s.rewards['exact']), 4) AS exact_match,
       round(avg(s.reward), 4) AS mean_reward, count() AS rollouts,
       round(min(toUnixTimestamp64Micro(s.ts)) / 1e6, 3) AS first_ts
FROM scored AS s FINAL
INNER JOIN {rollouts_once(TRAIN_SPLIT, "rollout_id")} AS r ON s.rollout_id = r.rollout_id
WHERE s.run_id = {{run:String}}
GROUP BY version ORDER BY version
"""
"""Training-rollout reward by the policy version that sampled them (the reward curve)."""

SCORED_SQL = landed_scores(RUN)
"""A run's scores whose rollouts are stored too: what answering tasks waits for."""
