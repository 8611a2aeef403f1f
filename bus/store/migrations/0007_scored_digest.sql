-- `scored` rows' digest covers `scorer_version` (added by 0006): two scorer versions' scores of
-- one rollout differ in content even where their rewards agree. Rows stored before this
-- migration keep the digest they were stored with.
ALTER TABLE `scored` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, rollout_id, group_id, task_id, env, sample_index, group_size, reward, rewards, metrics, status, error, policy_version, completion_tokens, scorer_version);
