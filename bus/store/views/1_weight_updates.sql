-- Weight updates per run and version: the trainer writing the version (its train step's
-- metrics), then every inference worker loading it, timed from the WeightVersion's publication
-- to each worker's WeightLoaded (a worker swaps weights between two decode steps and publishes
-- WeightLoaded once it serves them, so its next token is on the new version). `share`: write +
-- publication to the last worker serving it, over the seconds of the step that made the
-- version. Times come from two processes' clocks: exact on one host, as good as the clocks'
-- sync across hosts.

CREATE OR REPLACE VIEW `weight_updates` AS
SELECT
    `v`.`run_id` AS `run_id`,
    `v`.`version` AS `version`,
    any(`v`.`format`) AS `format`,
    any(`s`.`weights_mb`) AS `weights_mb`,
    any(`s`.`write_s`) AS `write_s`,
    toInt64(uniqExactIf(`l`.`worker_id`, `l`.`worker_id` != '')) AS `workers`,
    if(`workers` > 0,
       dateDiff('microsecond', any(`v`.`ts`), minIf(`l`.`ts`, `l`.`worker_id` != '')) / 1e6,
       NULL) AS `first_served_s`,
    if(`workers` > 0,
       dateDiff('microsecond', any(`v`.`ts`), maxIf(`l`.`ts`, `l`.`worker_id` != '')) / 1e6,
       NULL) AS `last_served_s`,
    if(`workers` > 0, maxIf(`l`.`load_s`, `l`.`worker_id` != ''), NULL) AS `load_s`,
    any(`s`.`step_s`) AS `step_s`,
    if(`step_s` > 0 AND `workers` > 0, (`write_s` + `last_served_s`) / `step_s`, NULL) AS `share`
FROM (
    SELECT `run_id`, `version`, min(`ts`) AS `ts`, any(`format`) AS `format`
    FROM `weight_versions` FINAL
    GROUP BY `run_id`, `version`
) AS `v`
LEFT JOIN (
    SELECT `run_id`, `version`, `worker_id`, `ts`, `load_s` FROM `weights_loaded` FINAL
) AS `l` ON `l`.`run_id` = `v`.`run_id` AND `l`.`version` = `v`.`version`
LEFT JOIN (
    SELECT `run_id`, `step`, `metrics`['weights_mb'] AS `weights_mb`,
           `metrics`['weights_write_s'] AS `write_s`, `metrics`['step_s'] AS `step_s`
    FROM `train_steps` FINAL
    ORDER BY `ts` DESC
    LIMIT 1 BY `run_id`, `step`
) AS `s` ON `s`.`run_id` = `v`.`run_id` AND `s`.`step` = `v`.`version`
GROUP BY `v`.`run_id`, `v`.`version`;
