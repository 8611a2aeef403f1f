-- Analytics views (README "Views"): staleness, throughput, pass@k, errors by kind, latency,
-- and reward_by_step extended with its train and held-out parts. As in 0002, they read with
-- FINAL so a redelivered event counts once, a rollout passes with reward >= 1, and an errored
-- rollout is left out of means (pass@k counts it as a failed attempt, as `rlbus eval` does).
-- A train step or version is the trainer's `step`, which is the weights version it wrote.

-- TokenRecord.duration_s: the model call's own time, apart from the harness around it.
ALTER TABLE `tokens` ADD COLUMN IF NOT EXISTS `duration_s` Float64;

-- Sample age per train step, as the trainer counted it: versions behind the weights it trained
-- -> samples (kept and dropped alike), and the samples dropped as too stale by the
-- orchestrator or the trainer.
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
FROM `train_steps` FINAL;

-- Tokens per second by role and policy version. inference: completion tokens of the calls a
-- version served, over the wall time from the first of those calls' start to the last one's end
-- (NULL when that span is 0, e.g. calls not timed). trainer: the step that wrote the version,
-- its tokens over its own training seconds.
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
FROM `train_steps` FINAL;

-- Unbiased pass@k (Chen et al., 2021) per run and environment, averaged over tasks: a task with
-- n rollouts of which c passed scores 1 - C(n-c, k) / C(n, k). k runs over 1, 2, 4, 8, ... up
-- to the smallest number of rollouts any task of the run and environment has.
CREATE OR REPLACE VIEW `pass_at_k` AS
SELECT
    `run_id`,
    `env`,
    `k`,
    avg(if(`n` - `c` < `k`, 1., 1. - arrayProduct(arrayMap(i -> (`n` - `c` - i) / (`n` - i), range(`k`)))))
        AS `pass_at_k`,
    count() AS `tasks`,
    sum(`n`) AS `rollouts`
FROM
(
    SELECT
        `run_id`,
        `env`,
        `task_id`,
        `n`,
        `c`,
        min(`n`) OVER (PARTITION BY `run_id`, `env`) AS `smallest`
    FROM
    (
        SELECT
            `run_id`,
            `env`,
            `task_id`,
            count() AS `n`,
            countIf(`status` = 'ok' AND `reward` >= 1) AS `c`
        FROM `scored` FINAL
        GROUP BY `run_id`, `env`, `task_id`
    )
)
ARRAY JOIN arrayFilter(x -> x <= `smallest`, arrayMap(e -> toUInt64(pow(2, e)), range(21))) AS `k`
GROUP BY `run_id`, `env`, `k`;

-- Errors by where they happened and their kind: a rollout that failed (its harness's or
-- runtime's error_kind, '' -> 'unknown'), a reward that failed on a good rollout ('reward'),
-- and messages a consumer dead-lettered (kind = the consumer group; env = '').
CREATE OR REPLACE VIEW `errors_by_kind` AS
SELECT
    `run_id`,
    `env`,
    'rollout' AS `stage`,
    if(`error_kind` = '', 'unknown', toString(`error_kind`)) AS `kind`,
    count() AS `errors`,
    max(`ts`) AS `last_ts`,
    argMax(`error`, `ts`) AS `last_error`
FROM `rollouts` FINAL
WHERE `status` != 'ok'
GROUP BY `run_id`, `env`, `kind`
UNION ALL
SELECT
    `run_id`,
    `env`,
    'scoring' AS `stage`,
    'reward' AS `kind`,
    count() AS `errors`,
    max(`ts`) AS `last_ts`,
    argMax(`error`, `ts`) AS `last_error`
FROM `scored` FINAL
WHERE `status` != 'ok' AND `rollout_id` NOT IN (SELECT `rollout_id` FROM `rollouts` WHERE `status` != 'ok')
GROUP BY `run_id`, `env`, `kind`
UNION ALL
SELECT
    `run_id`,
    '' AS `env`,
    concat('dead_letter:', toString(`origin_topic`)) AS `stage`,
    toString(`consumer_group`) AS `kind`,
    count() AS `errors`,
    max(`ts`) AS `last_ts`,
    argMax(`error`, `ts`) AS `last_error`
FROM `dead_letters` FINAL
GROUP BY `run_id`, `stage`, `kind`;

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
FROM `rollouts` AS r FINAL
LEFT JOIN
(
    SELECT
        `run_id`,
        `rollout_id`,
        count() AS `calls`,
        sum(`duration_s`) AS `model_s`,
        groupArray(`duration_s`) AS `call_s`
    FROM `tokens` FINAL
    GROUP BY `run_id`, `rollout_id`
) AS c ON r.`run_id` = c.`run_id` AND r.`rollout_id` = c.`rollout_id`  -- a run's filter reaches both sides
GROUP BY `run_id`, `env`;

-- reward_by_step (0002) with its parts: rollouts of training tasks and of held-out tasks (the
-- orchestrator's evaluations: split 'test' in the rollout's info), by the version that sampled
-- them. The columns of 0002 keep their meaning.
CREATE OR REPLACE VIEW `reward_by_step` AS
SELECT
    `run_id`,
    `policy_version` AS `step`,
    count() AS `rollouts`,
    countIf(`status` != 'ok') AS `errors`,
    avgIf(`reward`, `status` = 'ok') AS `mean_reward`,
    avgIf(`reward` >= 1, `status` = 'ok') AS `pass_rate`,
    avgIf(`completion_tokens`, `status` = 'ok') AS `mean_completion_tokens`,
    stddevPopIf(`reward`, `status` = 'ok') AS `reward_stddev`,
    countIf(NOT `held_out`) AS `train_rollouts`,
    avgIf(`reward`, `status` = 'ok' AND NOT `held_out`) AS `train_mean_reward`,
    countIf(`held_out`) AS `held_out_rollouts`,
    avgIf(`reward`, `status` = 'ok' AND `held_out`) AS `held_out_mean_reward`,
    avgIf(`reward` >= 1, `status` = 'ok' AND `held_out`) AS `held_out_pass_rate`,
    min(`ts`) AS `first_ts`,
    max(`ts`) AS `last_ts`
FROM
(
    -- A membership test needs no FINAL, so the held-out set is read without merging.
    SELECT *, `rollout_id` IN (
        SELECT `rollout_id` FROM `rollouts` WHERE JSONExtractString(`info`, 'split') = 'test'
    ) AS `held_out`
    FROM `scored` FINAL
)
GROUP BY `run_id`, `step`;
