-- A minmax index on ingested_at in every event table. The sink's conflict check
-- (consumers/sink/sink.py, every store.conflict_check_s) looks at the rows stored since its
-- last look; without an index that filter read the whole ingested_at column of every table
-- each time, so the sink's cost grew with the store. Parts stored before this migration get
-- the index by MATERIALIZE INDEX (a mutation, run in the background).
ALTER TABLE `tasks` ADD INDEX IF NOT EXISTS `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1;
ALTER TABLE `rollouts` ADD INDEX IF NOT EXISTS `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1;
ALTER TABLE `trace_nodes` ADD INDEX IF NOT EXISTS `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1;
ALTER TABLE `tokens` ADD INDEX IF NOT EXISTS `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1;
ALTER TABLE `scored` ADD INDEX IF NOT EXISTS `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1;
ALTER TABLE `batches` ADD INDEX IF NOT EXISTS `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1;
ALTER TABLE `weight_versions` ADD INDEX IF NOT EXISTS `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1;
ALTER TABLE `weights_loaded` ADD INDEX IF NOT EXISTS `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1;
ALTER TABLE `train_steps` ADD INDEX IF NOT EXISTS `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1;
ALTER TABLE `dead_letters` ADD INDEX IF NOT EXISTS `idx_ingested_at` `ingested_at` TYPE minmax GRANULARITY 1;
ALTER TABLE `tasks` MATERIALIZE INDEX `idx_ingested_at`;
ALTER TABLE `rollouts` MATERIALIZE INDEX `idx_ingested_at`;
ALTER TABLE `trace_nodes` MATERIALIZE INDEX `idx_ingested_at`;
ALTER TABLE `tokens` MATERIALIZE INDEX `idx_ingested_at`;
ALTER TABLE `scored` MATERIALIZE INDEX `idx_ingested_at`;
ALTER TABLE `batches` MATERIALIZE INDEX `idx_ingested_at`;
ALTER TABLE `weight_versions` MATERIALIZE INDEX `idx_ingested_at`;
ALTER TABLE `weights_loaded` MATERIALIZE INDEX `idx_ingested_at`;
ALTER TABLE `train_steps` MATERIALIZE INDEX `idx_ingested_at`;
ALTER TABLE `dead_letters` MATERIALIZE INDEX `idx_ingested_at`;
