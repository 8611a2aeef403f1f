-- Sample age per train step, as the trainer counted it: versions behind the weights it trained
-- -> samples (kept and dropped alike), and the samples dropped as too stale by the
-- orchestrator or the trainer. A train step or version is the trainer's `step`, which is the
-- weights version it wrote; a step trained again by a resumed trainer counts as its newest
-- attempt.

CREATE OR REPLACE VIEW `staleness` AS
SELECT
    `run_id`,
    `step`,
    arraySum(mapValues(`staleness`)) AS `samples`,
    mapSort(mapFromArrays(arrayMap(k -> toInt64(k), mapKeys(`staleness`)), mapValues(`staleness`)))
        AS `histogram`,
    arraySum(arrayMap((k, v) -> toInt64(k) * v, mapKeys(`staleness`), mapValues(`staleness`)))
        / `samples` AS `mean_versions_behind`,  -- nan for a step that saw no samples
    arrayMax(arrayMap(k -> toInt64(k), mapKeys(`staleness`))) AS `max_versions_behind`,
    `dropped_stale`
FROM (SELECT * FROM `train_steps` FINAL ORDER BY `ts` DESC LIMIT 1 BY `run_id`, `step`);
