-- Messages that could not be handled, by the topic they came from and the consumer that gave up.

CREATE OR REPLACE VIEW `dead_letters_by_topic` AS
SELECT
    `run_id`,
    `origin_topic`,
    `consumer_group`,
    count() AS `messages`,
    max(`ts`) AS `last_ts`,
    argMax(`error`, `ts`) AS `last_error`
FROM `dead_letters` FINAL
GROUP BY `run_id`, `origin_topic`, `consumer_group`;
