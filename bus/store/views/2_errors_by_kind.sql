-- Errors by where they happened and their kind: a rollout that failed (its harness's or
-- runtime's error_kind, '' -> 'unknown'), a reward that failed on a good rollout ('reward', in
-- one scorer version's scores), and messages a consumer dead-lettered (kind = the consumer
-- group; env = '').

CREATE OR REPLACE VIEW `errors_by_kind_at` AS
SELECT
    `run_id`,
    `env`,
    'rollout' AS `stage`,
    if(`error_kind` = '', 'unknown', toString(`error_kind`)) AS `kind`,
    uniqExact(`rollout_id`) AS `errors`,  -- a rollout stored with two contents fails once
    max(`ts`) AS `last_ts`,
    argMax(`error`, `ts`) AS `last_error`
FROM `rollouts` FINAL
WHERE `status` != 'ok'
GROUP BY `run_id`, `env`, `kind`
UNION ALL
SELECT
    `run_id`,
    `env`,
    'scoring' AS `stage`,
    'reward' AS `kind`,
    count() AS `errors`,
    max(`ts`) AS `last_ts`,
    argMax(`error`, `ts`) AS `last_error`
FROM `scores_at`(version = {version:String})
WHERE `status` != 'ok' AND `rollout_id` NOT IN (SELECT `rollout_id` FROM `rollouts` WHERE `status` != 'ok')
GROUP BY `run_id`, `env`, `kind`
UNION ALL
SELECT
    `run_id`,
    '' AS `env`,
    concat('dead_letter:', toString(`origin_topic`)) AS `stage`,
    toString(`consumer_group`) AS `kind`,
    count() AS `errors`,
    max(`ts`) AS `last_ts`,
    argMax(`error`, `ts`) AS `last_error`
FROM `dead_letters` FINAL
GROUP BY `run_id`, `stage`, `kind`;

CREATE OR REPLACE VIEW `errors_by_kind` AS SELECT * FROM `errors_by_kind_at`(version = '');
