-- Prompt tokens are summed over calls, so a multi-turn rollout counts its shared prefix per call.

CREATE OR REPLACE VIEW `tokens_per_rollout` AS
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
