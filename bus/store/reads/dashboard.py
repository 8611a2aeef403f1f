"""What `rlbus run`'s live table (rlbus.launch.dashboard) reads while the sink holds the store."""

from __future__ import annotations

from rlbus.bus.store.reads.common import held_out_by_version

LATEST_STEP = (
    "SELECT step, loss, grad_norm, entropy, mismatch_kl, metrics['off_policy_kl'], tokens_per_s, "
    "num_samples, dropped_stale, staleness FROM train_steps FINAL WHERE run_id = {run:String} "
    "ORDER BY step DESC LIMIT 1"
)
"""The run's newest trainer step and its metrics."""
TRAIN_REWARD = (
    "SELECT max(policy_version), avgIf(reward, status = 'ok'), count() FROM ("
    "SELECT policy_version, reward, status FROM scored FINAL WHERE run_id = {run:String} "
    "AND rollout_id IN (SELECT rollout_id FROM rollouts WHERE run_id = {run:String} "
    "AND JSONExtractString(info, 'split') = 'train') ORDER BY ts DESC LIMIT 256)"
)
"""The mean reward of the newest 256 training rollouts, and the newest version among them."""
HELD_OUT = held_out_by_version("avg(s.reward >= 1) AS pass_rate, count() AS rollouts")
"""The held-out pass rate of each evaluated weights version."""
SERVED = "SELECT max(version) FROM weights_loaded FINAL WHERE run_id = {run:String}"
"""The newest weights version an inference worker serves."""
