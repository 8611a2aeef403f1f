-- Insert dedup remembers 1,000 blocks a table, not 10,000 (DEFAULT_DEDUP_WINDOW in
-- rlbus/config/settings.py says why). Each remembered block holds ~250 B of the engine's
-- memory: a sink that held the store for hours grew ~9 MB/h until every table's log was full.
-- A sink applies store.dedup_window over this as it opens the store.

ALTER TABLE `tasks` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `rollouts` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `trace_nodes` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `tokens` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `scored` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `batches` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `weight_versions` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `weights_loaded` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `train_steps` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `dead_letters` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `health_samples` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `incidents` MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE `latest_scores` MODIFY SETTING non_replicated_deduplication_window = 1000;
