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

-- The `conflicts` view over these digests is defined in bus/store/views/.
