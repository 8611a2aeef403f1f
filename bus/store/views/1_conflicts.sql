-- Every id stored with more than one content, with where each came from. Empty is the normal
-- state; anything here is a redone computation whose results differ (both are kept; the
-- digest column is migration 0005's).

CREATE OR REPLACE VIEW `conflicts` AS
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
    UNION ALL
    SELECT 'health_samples', `event_id`, any(`run_id`), uniqExact(`digest`),
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)), min(`ingested_at`), max(`ingested_at`)
    FROM `health_samples` FINAL GROUP BY `event_id`
    UNION ALL
    SELECT 'incidents', `event_id`, any(`run_id`), uniqExact(`digest`),
        groupArray((`digest`, `kafka_partition`, `kafka_offset`, `ingested_at`)), min(`ingested_at`), max(`ingested_at`)
    FROM `incidents` FINAL GROUP BY `event_id`
)
WHERE `versions` > 1;
