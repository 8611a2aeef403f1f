-- A local run's health over time (`rlbus run` publishes them on the `health` topic):
-- health_samples, each process's resident memory and each consumer group's lag at one moment;
-- incidents, what happened to the run (a role exited or restarted, the broker rotated).
-- Tables as `python -m rlbus.bus.store.ddl` generates them, each with 0010's ingested_at index.

CREATE TABLE IF NOT EXISTS `health_samples`
(
    `event_id` String,
    `schema_version` Int64,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `rss_mib` Map(String, Float64),
    `lag` Map(String, Int64),
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, rss_mib, lag),
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree
ORDER BY (`event_id`, `digest`)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `incidents`
(
    `event_id` String,
    `schema_version` Int64,
    `ts` DateTime64(6, 'UTC'),
    `run_id` LowCardinality(String),
    `incident` LowCardinality(String),
    `detail` String,
    `process` LowCardinality(String),
    `kafka_partition` UInt32,
    `kafka_offset` UInt64,
    `ingested_at` DateTime64(6, 'UTC') DEFAULT now64(6),
    `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, incident, detail, process),
    INDEX `idx_run_id` `run_id` TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree
ORDER BY (`event_id`, `digest`)
SETTINGS non_replicated_deduplication_window = 10000;
