-- Held-out reward per run, environment and the policy version that sampled the rollouts (the
-- orchestrator's evaluations: split 'test' in the rollout's info), over one scorer version: a run
-- of several environments (an experts recipe's student, a joint run) compared per environment.

CREATE OR REPLACE VIEW `held_out_by_env_at` AS
SELECT
    `run_id`,
    `env`,
    `policy_version` AS `step`,
    uniqExact(`task_id`) AS `tasks`,
    count() AS `rollouts`,
    countIf(`status` != 'ok') AS `errors`,
    avgIf(`reward`, `status` = 'ok') AS `mean_reward`,
    avgIf(`reward` >= 1, `status` = 'ok') AS `pass_rate`
FROM `scores_at`(version = {version:String})
-- A membership test needs no FINAL, so the held-out set is read without merging.
WHERE `rollout_id` IN (
    SELECT `rollout_id` FROM `rollouts` WHERE JSONExtractString(`info`, 'split') = 'test'
)
GROUP BY `run_id`, `env`, `step`;

CREATE OR REPLACE VIEW `held_out_by_env` AS SELECT * FROM `held_out_by_env_at`(version = '');
