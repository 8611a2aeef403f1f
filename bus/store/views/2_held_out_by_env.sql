-- Held-out reward per run, environment and evaluation (the orchestrator's evaluations: split
-- 'test' in the rollout's info, `eval_version` the weights version each was made for), over one
-- scorer version: a run of several environments (an experts recipe's student, a joint run)
-- compared per environment. In an async run the trainer moves on while an evaluation samples,
-- so its tasks are sampled by several versions (`min_policy_version`..`max_policy_version`):
-- grouped by those, one evaluation would read as several points of a few tasks each.

CREATE OR REPLACE VIEW `held_out_by_env_at` AS
SELECT
    s.`run_id` AS `run_id`,
    s.`env` AS `env`,
    JSONExtractUInt(r.`held_info`, 'eval_version') AS `step`,
    uniqExact(s.`task_id`) AS `tasks`,
    count() AS `rollouts`,
    countIf(s.`status` != 'ok') AS `errors`,
    avgIf(s.`reward`, s.`status` = 'ok') AS `mean_reward`,
    avgIf(s.`reward` >= 1, s.`status` = 'ok') AS `pass_rate`,
    min(s.`policy_version`) AS `min_policy_version`,
    max(s.`policy_version`) AS `max_policy_version`
FROM `scores_at`(version = {version:String}) AS s
-- One row per held-out rollout: a redelivered rollout is stored twice with the same info.
INNER JOIN (
    SELECT `rollout_id`, any(`info`) AS `held_info` FROM `rollouts`
    WHERE JSONExtractString(`info`, 'split') = 'test'
    GROUP BY `rollout_id`
) AS r ON s.`rollout_id` = r.`rollout_id`
GROUP BY `run_id`, `env`, `step`;

CREATE OR REPLACE VIEW `held_out_by_env` AS SELECT * FROM `held_out_by_env_at`(version = '');
