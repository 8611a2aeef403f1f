-- TrainBatch carries the orchestrator's drop counts and metrics (rlbus.schemas.events).
ALTER TABLE `batches` ADD COLUMN IF NOT EXISTS `dropped_stale` Int64;
ALTER TABLE `batches` ADD COLUMN IF NOT EXISTS `metrics` Map(String, Float64);
