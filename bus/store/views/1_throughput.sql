-- Tokens per second by role and policy version. inference: completion tokens of the calls a
-- version served, over the wall time from the first of those calls' start to the last one's end
-- (NULL when that span is 0, e.g. calls not timed). trainer: the step that wrote the version,
-- its tokens over its own training seconds (its newest attempt, when a resumed trainer trained it
-- again).

CREATE OR REPLACE VIEW `throughput` AS
SELECT
    `run_id`,
    'inference' AS `role`,
    `policy_version`,
    toInt64(count()) AS `events`,
    toInt64(sum(length(`completion_ids`))) AS `tokens`,
    toFloat64(
        dateDiff('microsecond', min(`ts` - toIntervalMicrosecond(toInt64(`duration_s` * 1e6))), max(`ts`))
    ) / 1e6 AS `seconds`,
    if(`seconds` > 0, `tokens` / `seconds`, NULL) AS `tokens_per_s`
FROM `tokens` FINAL
GROUP BY `run_id`, `policy_version`
UNION ALL
SELECT
    `run_id`,
    'trainer' AS `role`,
    `step` AS `policy_version`,
    toInt64(1) AS `events`,
    `num_tokens` AS `tokens`,
    if(`tokens_per_s` > 0, `num_tokens` / `tokens_per_s`, 0) AS `seconds`,
    if(`tokens_per_s` > 0, `tokens_per_s`, NULL) AS `tokens_per_s`
FROM (SELECT * FROM `train_steps` FINAL ORDER BY `ts` DESC LIMIT 1 BY `run_id`, `step`);
