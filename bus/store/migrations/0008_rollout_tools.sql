-- RolloutCompleted.tools: the tools offered to the model, what a chat-format export writes next
-- to the messages (`rlbus export`). Rollouts stored before this migration have '' (no tools
-- recorded). The digest covers the new column, as 0005 made it cover every event column.
ALTER TABLE `rollouts` ADD COLUMN IF NOT EXISTS `tools` String;
ALTER TABLE `rollouts` MODIFY COLUMN `digest` UInt64 DEFAULT cityHash64(event_id, schema_version, run_id, rollout_id, group_id, task_id, env, sample_index, group_size, prompt, completion, answer, info, status, error, error_kind, model, harness, num_turns, prompt_tokens, completion_tokens, min_policy_version, max_policy_version, duration_s, tools);

