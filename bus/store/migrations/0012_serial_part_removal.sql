-- Old parts removed on one thread. ClickHouse removes a table's inactive parts on up to 128
-- threads once they number concurrent_part_removal_threshold (100); the threads come from its
-- global pool, which keeps them idle for the life of the process (up to 1000; the embedded
-- engine does not take the server setting that lowers it), and the sink's memory crept as they
-- took turns with their stacks and allocator caches (tests/store/test_store_threads.py;
-- docs/benchmarks.md). One thread keeps up: it removed ~3,500 old parts in under 2 s here.

ALTER TABLE `tasks` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `rollouts` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `trace_nodes` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `tokens` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `scored` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `batches` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `weight_versions` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `weights_loaded` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `train_steps` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `dead_letters` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `health_samples` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `incidents` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `latest_scores` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
ALTER TABLE `schema_migrations` MODIFY SETTING concurrent_part_removal_threshold = 1000000000;
