-- Unbiased pass@k (Chen et al., 2021) per run and environment, averaged over tasks: a task with
-- n rollouts of which c passed scores 1 - C(n-c, k) / C(n, k). k runs over 1, 2, 4, 8, ... up
-- to the smallest number of rollouts any task of the run and environment has. An errored
-- rollout counts as a failed attempt, as `rlbus eval` does.

CREATE OR REPLACE VIEW `pass_at_k_at` AS
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
        FROM `scores_at`(version = {version:String})
        GROUP BY `run_id`, `env`, `task_id`
    )
)
ARRAY JOIN arrayFilter(x -> x <= `smallest`, arrayMap(e -> toUInt64(pow(2, e)), range(21))) AS `k`
GROUP BY `run_id`, `env`, `k`;

CREATE OR REPLACE VIEW `pass_at_k` AS SELECT * FROM `pass_at_k_at`(version = '');
