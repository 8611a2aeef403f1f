"""What the launcher reads when an embedded broker died (rlbus.launch.broker_losses): the last
offset the sink stored of each partition, to set against what the broker had acknowledged."""

from __future__ import annotations

STORED_END = (
    "SELECT kafka_partition, max(kafka_offset) FROM {table} "
    "WHERE ingested_at >= {{since:DateTime64(6)}} GROUP BY kafka_partition"
)
"""Per partition, the newest stored offset of an event table (`table`, filled in with
str.format) since the broker started."""
DEAD_END = (
    "SELECT origin_partition, max(origin_offset) FROM dead_letters "
    "WHERE origin_topic = {topic:String} AND ingested_at >= {since:DateTime64(6)} "
    "GROUP BY origin_partition"
)
"""Per partition of a topic, the newest offset dead-lettered since the broker started."""
