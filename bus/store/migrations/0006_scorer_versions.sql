-- RolloutScored.scorer_version: which scoring a score belongs to (the judge's rules digest, or the
-- name given to `rlbus rescore --as`); '' for scores stored before versions existed. A rollout
-- has one score per version, and the views over scores count each rollout once.
ALTER TABLE `scored` ADD COLUMN IF NOT EXISTS `scorer_version` String;

-- Each rollout's newest score, whichever version gave it: an index kept by ClickHouse as scores
-- are inserted (the history stays whole in `scored`), ordered so one run's rows are read alone.
-- Read it with FINAL. A column added to `scored` later is added to this table and to
-- latest_scores_feed by a new migration, and to scores_at (bus/store/views/).
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

-- The views over scores (scores_at, NAME_at) are defined in bus/store/views/.
