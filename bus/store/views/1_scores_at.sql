-- One score per rollout: `scores_at(version = '')` is each rollout's newest score (the
-- latest_scores table, kept by migration 0006's materialized view), and
-- `scores_at(version = 'V')` version V's scores alone. Each view over scores is
-- `NAME_at(version = ...)`, and `NAME` is `NAME_at(version = '')`. Views read with FINAL so a
-- redelivered event counts once; a rollout passes when it got full credit (reward >= 1); an
-- errored rollout is counted apart and left out of means and pass rates.

CREATE OR REPLACE VIEW `scores_at` AS
SELECT `event_id`, `ts`, `run_id`, `rollout_id`, `group_id`, `task_id`, `env`, `sample_index`, `group_size`,
    `reward`, `rewards`, `metrics`, `status`, `error`, `policy_version`, `completion_tokens`, `scorer_version`
FROM `latest_scores` FINAL
WHERE {version:String} = ''
UNION ALL
SELECT `event_id`, `ts`, `run_id`, `rollout_id`, `group_id`, `task_id`, `env`, `sample_index`, `group_size`,
    `reward`, `rewards`, `metrics`, `status`, `error`, `policy_version`, `completion_tokens`, `scorer_version`
FROM `scored` FINAL
WHERE {version:String} != '' AND `scorer_version` = {version:String};
