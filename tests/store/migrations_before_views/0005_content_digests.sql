-- A content digest per row, last in the sorting key: ReplacingMergeTree then collapses only true
-- duplicates, and an id stored with two different contents stays visible instead of being
-- silently replaced. ClickHouse computes it as each row is inserted: cityHash64 over every event
-- column but `ts` (bus.store.columns.digest_expression; tests/test_store_schema.py checks these
-- defaults against it). Rows stored before this migration have digest 0. (A key column cannot
-- be added with a default in one statement, hence two per table.)
ALTER TABLE `tasks` ADD COLUMN IF NOT EXISTS `digest` UInt64, MODIFY ORDER BY (`task_id`, `event_id`, `digest`);
ALTER TABLE `tasks` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, task_id, env, prompt, answer, info, group_size, split);
ALTER TABLE `rollouts` ADD COLUMN IF NOT EXISTS `digest` UInt64, MODIFY ORDER BY (`rollout_id`, `event_id`, `digest`);
ALTER TABLE `rollouts` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, rollout_id, group_id, task_id, env, sample_index, group_size, prompt, completion, answer, info, status, error, error_kind, model, harness, num_turns, prompt_tokens, completion_tokens, min_policy_version, max_policy_version, duration_s);
ALTER TABLE `trace_nodes` ADD COLUMN IF NOT EXISTS `digest` UInt64, MODIFY ORDER BY (`rollout_id`, `node_id`, `event_id`, `digest`);
ALTER TABLE `trace_nodes` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, node_id, rollout_id, parent_id, branch_id, index, role, message, token_ids, sampled, call_index);
ALTER TABLE `tokens` ADD COLUMN IF NOT EXISTS `digest` UInt64, MODIFY ORDER BY (`rollout_id`, `call_index`, `event_id`, `digest`);
ALTER TABLE `tokens` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, rollout_id, group_id, call_index, node_id, model, prompt_ids, completion_ids, logprobs, policy_version, finish_reason, duration_s);
ALTER TABLE `scored` ADD COLUMN IF NOT EXISTS `digest` UInt64, MODIFY ORDER BY (`rollout_id`, `event_id`, `digest`);
ALTER TABLE `scored` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, rollout_id, group_id, task_id, env, sample_index, group_size, reward, rewards, metrics, status, error, policy_version, completion_tokens);
ALTER TABLE `batches` ADD COLUMN IF NOT EXISTS `digest` UInt64, MODIFY ORDER BY (`batch_id`, `event_id`, `digest`);
ALTER TABLE `batches` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, batch_id, step, samples, algorithm, loss, num_tokens, min_policy_version, max_policy_version, dropped_stale, metrics);
ALTER TABLE `weight_versions` ADD COLUMN IF NOT EXISTS `digest` UInt64, MODIFY ORDER BY (`version`, `event_id`, `digest`);
ALTER TABLE `weight_versions` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, version, step, uri, format, num_params);
ALTER TABLE `weights_loaded` ADD COLUMN IF NOT EXISTS `digest` UInt64, MODIFY ORDER BY (`version`, `worker_id`, `event_id`, `digest`);
ALTER TABLE `weights_loaded` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, version, worker_id, load_s, uri);
ALTER TABLE `train_steps` ADD COLUMN IF NOT EXISTS `digest` UInt64, MODIFY ORDER BY (`step`, `event_id`, `digest`);
ALTER TABLE `train_steps` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, step, loss, grad_norm, entropy, lr, mismatch_kl, num_samples, num_tokens, tokens_per_s, dropped_stale, staleness, metrics);
ALTER TABLE `dead_letters` ADD COLUMN IF NOT EXISTS `digest` UInt64, MODIFY ORDER BY (`origin_topic`, `origin_partition`, `origin_offset`, `event_id`, `digest`);
ALTER TABLE `dead_letters` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, origin_topic, origin_partition, origin_offset, consumer_group, error, raw, key);

-- Every id stored with more than one content, with where each came from. Empty is the normal
-- state; anything here is a redone computation whose results differ (both are kept).
CREATE VIEW IF NOT EXISTS `conflicts` AS
SELECT `table`, `event_id`, `run_id`, `versions`, `origins`, `first_ingested`, `last_ingested`
FROM (
    SELECT 'tasks' AS `table`, `event_id`, any(`run_id`) AS `run_id`, uniqExact(`digest`) AS `versions`,
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)) AS `origins`,
        min(`ingested_at`) AS `first_ingested`, max(`ingested_at`) AS `last_ingested`
    FROM `tasks` FINAL GROUP BY `event_id`
    UNION ALL
    SELECT 'rollouts', `event_id`, any(`run_id`), uniqExact(`digest`),
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)), min(`ingested_at`), max(`ingested_at`)
    FROM `rollouts` FINAL GROUP BY `event_id`
    UNION ALL
    SELECT 'trace_nodes', `event_id`, any(`run_id`), uniqExact(`digest`),
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)), min(`ingested_at`), max(`ingested_at`)
    FROM `trace_nodes` FINAL GROUP BY `event_id`
    UNION ALL
    SELECT 'tokens', `event_id`, any(`run_id`), uniqExact(`digest`),
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)), min(`ingested_at`), max(`ingested_at`)
    FROM `tokens` FINAL GROUP BY `event_id`
    UNION ALL
    SELECT 'scored', `event_id`, any(`run_id`), uniqExact(`digest`),
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)), min(`ingested_at`), max(`ingested_at`)
    FROM `scored` FINAL GROUP BY `event_id`
    UNION ALL
    SELECT 'batches', `event_id`, any(`run_id`), uniqExact(`digest`),
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)), min(`ingested_at`), max(`ingested_at`)
    FROM `batches` FINAL GROUP BY `event_id`
    UNION ALL
    SELECT 'weight_versions', `event_id`, any(`run_id`), uniqExact(`digest`),
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)), min(`ingested_at`), max(`ingested_at`)
    FROM `weight_versions` FINAL GROUP BY `event_id`
    UNION ALL
    SELECT 'weights_loaded', `event_id`, any(`run_id`), uniqExact(`digest`),
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)), min(`ingested_at`), max(`ingested_at`)
    FROM `weights_loaded` FINAL GROUP BY `event_id`
    UNION ALL
    SELECT 'train_steps', `event_id`, any(`run_id`), uniqExact(`digest`),
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)), min(`ingested_at`), max(`ingested_at`)
    FROM `train_steps` FINAL GROUP BY `event_id`
    UNION ALL
    SELECT 'dead_letters', `event_id`, any(`run_id`), uniqExact(`digest`),
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)), min(`ingested_at`), max(`ingested_at`)
    FROM `dead_letters` FINAL GROUP BY `event_id`
)
WHERE `versions` > 1;
