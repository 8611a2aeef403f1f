-- Time per run and environment: whole rollouts (duration_s), the model calls in them
-- (tokens.duration_s) and the harness's share (a rollout's time outside its model calls).
-- Percentiles interpolate between samples (numpy.percentile's default, Excel's PERCENTILE.INC).

CREATE OR REPLACE VIEW `latency` AS
SELECT
    r.`run_id` AS `run_id`,
    r.`env` AS `env`,
    count() AS `rollouts`,
    quantileExactInclusive(0.5)(r.`duration_s`) AS `rollout_p50_s`,
    quantileExactInclusive(0.9)(r.`duration_s`) AS `rollout_p90_s`,
    quantileExactInclusive(0.99)(r.`duration_s`) AS `rollout_p99_s`,
    max(r.`duration_s`) AS `rollout_max_s`,
    toInt64(sum(c.`calls`)) AS `model_calls`,
    quantileExactInclusiveArray(0.5)(c.`call_s`) AS `call_p50_s`,
    quantileExactInclusiveArray(0.9)(c.`call_s`) AS `call_p90_s`,
    quantileExactInclusiveArray(0.99)(c.`call_s`) AS `call_p99_s`,
    maxArray(c.`call_s`) AS `call_max_s`,
    quantileExactInclusive(0.5)(greatest(r.`duration_s` - c.`model_s`, 0)) AS `harness_p50_s`,
    quantileExactInclusive(0.9)(greatest(r.`duration_s` - c.`model_s`, 0)) AS `harness_p90_s`,
    if(sum(r.`duration_s`) > 0, sum(c.`model_s`) / sum(r.`duration_s`), NULL) AS `model_share`
FROM
(
    -- One row per rollout: one stored with two contents (its task rolled out again under the
    -- same ids after a crash) counts as its newest. Keyed by run and env too, so a filter on
    -- either still reaches the table.
    SELECT `run_id`, `env`, `rollout_id`, `duration_s` FROM `rollouts` FINAL
    ORDER BY `ts` DESC LIMIT 1 BY `run_id`, `env`, `rollout_id`
) AS r
LEFT JOIN
(
    SELECT
        `run_id`,
        `rollout_id`,
        count() AS `calls`,
        sum(`duration_s`) AS `model_s`,
        groupArray(`duration_s`) AS `call_s`
    FROM
    (
        SELECT `run_id`, `rollout_id`, `duration_s` FROM `tokens` FINAL
        ORDER BY `ts` DESC LIMIT 1 BY `run_id`, `rollout_id`, `event_id`
    )
    GROUP BY `run_id`, `rollout_id`
) AS c ON r.`run_id` = c.`run_id` AND r.`rollout_id` = c.`rollout_id`  -- a run's filter reaches both sides
GROUP BY `run_id`, `env`;
