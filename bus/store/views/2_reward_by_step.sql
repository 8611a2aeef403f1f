-- Reward by the policy version that sampled the rollouts (the trainer step that made it), with
-- its parts: rollouts of training tasks and of held-out tasks (the orchestrator's evaluations:
-- split 'test' in the rollout's info), over one scorer version.

CREATE OR REPLACE VIEW `reward_by_step_at` AS
SELECT
    `run_id`,
    `policy_version` AS `step`,
    count() AS `rollouts`,
    countIf(`status` != 'ok') AS `errors`,
    avgIf(`reward`, `status` = 'ok') AS `mean_reward`,
    avgIf(`reward` >= 1, `status` = 'ok') AS `pass_rate`,
    avgIf(`completion_tokens`, `status` = 'ok') AS `mean_completion_tokens`,
    stddevPopIf(`reward`, `status` = 'ok') AS `reward_stddev`,
    countIf(NOT `held_out`) AS `train_rollouts`,
    avgIf(`reward`, `status` = 'ok' AND NOT `held_out`) AS `train_mean_reward`,
    countIf(`held_out`) AS `held_out_rollouts`,
    avgIf(`reward`, `status` = 'ok' AND `held_out`) AS `held_out_mean_reward`,
    avgIf(`reward` >= 1, `status` = 'ok' AND `held_out`) AS `held_out_pass_rate`,
    min(`ts`) AS `first_ts`,
    max(`ts`) AS `last_ts`
FROM
(
    -- A membership test needs no FINAL, so the held-out set is read without merging.
    SELECT *, `rollout_id` IN (
        SELECT `rollout_id` FROM `rollouts` WHERE JSONExtractString(`info`, 'split') = 'test'
    ) AS `held_out`
    FROM `scores_at`(version = {version:String})
)
GROUP BY `run_id`, `step`;

CREATE OR REPLACE VIEW `reward_by_step` AS SELECT * FROM `reward_by_step_at`(version = '');
