-- The analytics views this migration created (staleness, throughput, pass@k, errors by kind,
-- latency, reward_by_step's train and held-out parts) are defined in bus/store/views/.

-- TokenRecord.duration_s: the model call's own time, apart from the harness around it.
ALTER TABLE `tokens` ADD COLUMN IF NOT EXISTS `duration_s` Float64;
