-- Views over the event tables. They read with FINAL so a redelivered event counts once.
-- A rollout "passes" when it got full credit (reward >= 1); errored rollouts are counted
-- apart and left out of means and pass rates.

-- Reward by the policy version that sampled the rollouts (the trainer step that made it).
CREATE VIEW IF NOT EXISTS `reward_by_step` AS
SELECT
    `run_id`,
    `policy_version` AS `step`,
    count() AS `rollouts`,
    countIf(`status` != 'ok') AS `errors`,
    avgIf(`reward`, `status` = 'ok') AS `mean_reward`,
    avgIf(`reward` >= 1, `status` = 'ok') AS `pass_rate`,
    avgIf(`completion_tokens`, `status` = 'ok') AS `mean_completion_tokens`
FROM `scored` FINAL
GROUP BY `run_id`, `step`;

CREATE VIEW IF NOT EXISTS `env_pass_rate` AS
SELECT
    `run_id`,
    `env`,
    uniqExact(`task_id`) AS `tasks`,
    count() AS `rollouts`,
    countIf(`status` != 'ok') AS `errors`,
    avgIf(`reward`, `status` = 'ok') AS `mean_reward`,
    avgIf(`reward` >= 1, `status` = 'ok') AS `pass_rate`
FROM `scored` FINAL
GROUP BY `run_id`, `env`;

-- Prompt tokens are summed over calls, so a multi-turn rollout counts its shared prefix per call.
CREATE VIEW IF NOT EXISTS `tokens_per_rollout` AS
SELECT
    `run_id`,
    `rollout_id`,
    count() AS `calls`,
    sum(length(`prompt_ids`)) AS `prompt_tokens`,
    sum(length(`completion_ids`)) AS `completion_tokens`,
    min(`policy_version`) AS `min_policy_version`,
    max(`policy_version`) AS `max_policy_version`
FROM `tokens` FINAL
GROUP BY `run_id`, `rollout_id`;

CREATE VIEW IF NOT EXISTS `dead_letters_by_topic` AS
SELECT
    `run_id`,
    `origin_topic`,
    `consumer_group`,
    count() AS `messages`,
    max(`ts`) AS `last_ts`,
    argMax(`error`, `ts`) AS `last_error`
FROM `dead_letters` FINAL
GROUP BY `run_id`, `origin_topic`, `consumer_group`;
