-- Rollouts, mean reward and pass rate per run and environment, over one scorer version.

CREATE OR REPLACE VIEW `env_pass_rate_at` AS
SELECT
    `run_id`,
    `env`,
    uniqExact(`task_id`) AS `tasks`,
    count() AS `rollouts`,
    countIf(`status` != 'ok') AS `errors`,
    avgIf(`reward`, `status` = 'ok') AS `mean_reward`,
    avgIf(`reward` >= 1, `status` = 'ok') AS `pass_rate`
FROM `scores_at`(version = {version:String})
GROUP BY `run_id`, `env`;

CREATE OR REPLACE VIEW `env_pass_rate` AS SELECT * FROM `env_pass_rate_at`(version = '');
