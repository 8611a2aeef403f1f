-- RolloutScored.scorer_version: which scoring a score belongs to (the judge's rules digest, or the
-- name given to `rlbus rescore --as`); '' for scores stored before versions existed. A rollout
-- has one score per version, and the views over scores count each rollout once.
ALTER TABLE `scored` ADD COLUMN IF NOT EXISTS `scorer_version` String;

-- Each rollout's newest score, whichever version gave it: an index kept by ClickHouse as scores
-- are inserted (the history stays whole in `scored`), ordered so one run's rows are read alone.
-- Read it with FINAL. A column added to `scored` later is added here and to the view too.
CREATE TABLE IF NOT EXISTS `latest_scores`
(
    `event_id` String,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `rollout_id` String,
    `group_id` String,
    `task_id` String,
    `env` LowCardinality(String),
    `sample_index` Int64,
    `group_size` Int64,
    `reward` Float64,
    `rewards` Map(String, Float64),
    `metrics` Map(String, Float64),
    `status` LowCardinality(String),
    `error` String,
    `policy_version` Int64,
    `completion_tokens` Int64,
    `scorer_version` String
)
ENGINE = ReplacingMergeTree(`ts`)
ORDER BY (`run_id`, `env`, `rollout_id`)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS `latest_scores_feed` TO `latest_scores` AS
SELECT `event_id`, `ts`, `run_id`, `rollout_id`, `group_id`, `task_id`, `env`, `sample_index`, `group_size`,
    `reward`, `rewards`, `metrics`, `status`, `error`, `policy_version`, `completion_tokens`, `scorer_version`
FROM `scored`;

-- Scores stored before this migration (a second run of this statement only adds copies that
-- FINAL collapses).
INSERT INTO `latest_scores`
SELECT `event_id`, `ts`, `run_id`, `rollout_id`, `group_id`, `task_id`, `env`, `sample_index`, `group_size`,
    `reward`, `rewards`, `metrics`, `status`, `error`, `policy_version`, `completion_tokens`, `scorer_version`
FROM `scored`;

-- One score per rollout: `scores_at(version = '')` is each rollout's newest score, and
-- `scores_at(version = 'V')` version V's scores alone. Each view over scores below is
-- `NAME_at(version = ...)`, and `NAME` is `NAME_at(version = '')`.
CREATE OR REPLACE VIEW `scores_at` AS
SELECT `event_id`, `ts`, `run_id`, `rollout_id`, `group_id`, `task_id`, `env`, `sample_index`, `group_size`,
    `reward`, `rewards`, `metrics`, `status`, `error`, `policy_version`, `completion_tokens`, `scorer_version`
FROM `latest_scores` FINAL
WHERE {version:String} = ''
UNION ALL
SELECT `event_id`, `ts`, `run_id`, `rollout_id`, `group_id`, `task_id`, `env`, `sample_index`, `group_size`,
    `reward`, `rewards`, `metrics`, `status`, `error`, `policy_version`, `completion_tokens`, `scorer_version`
FROM `scored` FINAL
WHERE {version:String} != '' AND `scorer_version` = {version:String};

-- reward_by_step (0004) over one version.
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

-- env_pass_rate (0002) over one version.
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

-- pass_at_k (0004) over one version.
CREATE OR REPLACE VIEW `pass_at_k_at` AS
SELECT
    `run_id`,
    `env`,
    `k`,
    avg(if(`n` - `c` < `k`, 1., 1. - arrayProduct(arrayMap(i -> (`n` - `c` - i) / (`n` - i), range(`k`)))))
        AS `pass_at_k`,
    count() AS `tasks`,
    sum(`n`) AS `rollouts`
FROM
(
    SELECT
        `run_id`,
        `env`,
        `task_id`,
        `n`,
        `c`,
        min(`n`) OVER (PARTITION BY `run_id`, `env`) AS `smallest`
    FROM
    (
        SELECT
            `run_id`,
            `env`,
            `task_id`,
            count() AS `n`,
            countIf(`status` = 'ok' AND `reward` >= 1) AS `c`
        FROM `scores_at`(version = {version:String})
        GROUP BY `run_id`, `env`, `task_id`
    )
)
ARRAY JOIN arrayFilter(x -> x <= `smallest`, arrayMap(e -> toUInt64(pow(2, e)), range(21))) AS `k`
GROUP BY `run_id`, `env`, `k`;

CREATE OR REPLACE VIEW `pass_at_k` AS SELECT * FROM `pass_at_k_at`(version = '');

-- errors_by_kind (0004), its scoring errors from one version.
CREATE OR REPLACE VIEW `errors_by_kind_at` AS
SELECT
    `run_id`,
    `env`,
    'rollout' AS `stage`,
    if(`error_kind` = '', 'unknown', toString(`error_kind`)) AS `kind`,
    count() AS `errors`,
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
