-- One table per event kind, generated from schemas/events.py by
-- `python -m rlbus.bus.store.ddl`. Never edit an applied migration: add a new one.

CREATE TABLE IF NOT EXISTS `tasks`
(
    `event_id` String,
    `schema_version` Int64,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `task_id` String,
    `env` LowCardinality(String),
    `prompt` String,
    `answer` String,
    `info` String,
    `group_size` Int64,
    `split` LowCardinality(String),
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX `idx_event_id` `event_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
ORDER BY (`task_id`, `event_id`)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `rollouts`
(
    `event_id` String,
    `schema_version` Int64,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `rollout_id` String,
    `group_id` String,
    `task_id` String,
    `env` LowCardinality(String),
    `sample_index` Int64,
    `group_size` Int64,
    `prompt` String,
    `completion` String,
    `answer` String,
    `info` String,
    `status` LowCardinality(String),
    `error` String,
    `error_kind` LowCardinality(String),
    `model` LowCardinality(String),
    `harness` LowCardinality(String),
    `num_turns` Int64,
    `prompt_tokens` Int64,
    `completion_tokens` Int64,
    `min_policy_version` Int64,
    `max_policy_version` Int64,
    `duration_s` Float64,
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX `idx_event_id` `event_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_group_id` `group_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_task_id` `task_id` TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
ORDER BY (`rollout_id`, `event_id`)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `trace_nodes`
(
    `event_id` String,
    `schema_version` Int64,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `node_id` String,
    `rollout_id` String,
    `parent_id` String,
    `branch_id` LowCardinality(String),
    `index` Int64,
    `role` LowCardinality(String),
    `message` String,
    `token_ids` Array(UInt32),
    `sampled` Bool,
    `call_index` Int64,
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX `idx_event_id` `event_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_node_id` `node_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_parent_id` `parent_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_branch_id` `branch_id` TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
ORDER BY (`rollout_id`, `node_id`, `event_id`)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `tokens`
(
    `event_id` String,
    `schema_version` Int64,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `rollout_id` String,
    `group_id` String,
    `call_index` Int64,
    `node_id` String,
    `model` LowCardinality(String),
    `prompt_ids` Array(UInt32),
    `completion_ids` Array(UInt32),
    `logprobs` Array(Float32),
    `policy_version` Int64,
    `finish_reason` LowCardinality(String),
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX `idx_event_id` `event_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_group_id` `group_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_node_id` `node_id` TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
ORDER BY (`rollout_id`, `call_index`, `event_id`)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `scored`
(
    `event_id` String,
    `schema_version` Int64,
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
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX `idx_event_id` `event_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_group_id` `group_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_task_id` `task_id` TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
ORDER BY (`rollout_id`, `event_id`)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `batches`
(
    `event_id` String,
    `schema_version` Int64,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `batch_id` String,
    `step` Int64,
    `samples` String,
    `algorithm` LowCardinality(String),
    `loss` LowCardinality(String),
    `num_tokens` Int64,
    `min_policy_version` Int64,
    `max_policy_version` Int64,
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX `idx_event_id` `event_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
ORDER BY (`batch_id`, `event_id`)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `weight_versions`
(
    `event_id` String,
    `schema_version` Int64,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `version` Int64,
    `step` Int64,
    `uri` String,
    `format` LowCardinality(String),
    `num_params` Int64,
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX `idx_event_id` `event_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
ORDER BY (`version`, `event_id`)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `weights_loaded`
(
    `event_id` String,
    `schema_version` Int64,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `version` Int64,
    `worker_id` String,
    `load_s` Float64,
    `uri` String,
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX `idx_event_id` `event_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_worker_id` `worker_id` TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
ORDER BY (`version`, `worker_id`, `event_id`)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `train_steps`
(
    `event_id` String,
    `schema_version` Int64,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `step` Int64,
    `loss` Float64,
    `grad_norm` Float64,
    `entropy` Float64,
    `lr` Float64,
    `mismatch_kl` Float64,
    `num_samples` Int64,
    `num_tokens` Int64,
    `tokens_per_s` Float64,
    `dropped_stale` Int64,
    `staleness` Map(String, Int64),
    `metrics` Map(String, Float64),
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX `idx_event_id` `event_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
ORDER BY (`step`, `event_id`)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `dead_letters`
(
    `event_id` String,
    `schema_version` Int64,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `origin_topic` LowCardinality(String),
    `origin_partition` Int64,
    `origin_offset` Int64,
    `consumer_group` LowCardinality(String),
    `error` String,
    `raw` String,
    `key` String,
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX `idx_event_id` `event_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
ORDER BY (`origin_topic`, `origin_partition`, `origin_offset`, `event_id`)
SETTINGS non_replicated_deduplication_window = 10000;
