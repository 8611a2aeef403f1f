-- Inference replicas (several inference servers per run):
-- WeightLoaded.url: the replica's /v1 URL, how env producers find the replicas of a run;
-- TokenRecord.replica: which replica sampled a call's tokens;
-- TaskPublished.min_policy_version: the version the orchestrator wants a task sampled with (env
-- producers skip replicas behind it). Rows stored before this migration have '' and 0 (not
-- said). Each digest covers its new column, as 0005 made digests cover every event column.
ALTER TABLE `weights_loaded` ADD COLUMN IF NOT EXISTS `url` String;
ALTER TABLE `weights_loaded` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, version, worker_id, load_s, uri, url);
ALTER TABLE `tokens` ADD COLUMN IF NOT EXISTS `replica` String;
ALTER TABLE `tokens` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, rollout_id, group_id, call_index, node_id, model, prompt_ids, completion_ids, logprobs, policy_version, replica, finish_reason, duration_s);
ALTER TABLE `tasks` ADD COLUMN IF NOT EXISTS `min_policy_version` Int64;
ALTER TABLE `tasks` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, task_id, env, prompt, answer, info, group_size, split, min_policy_version);
