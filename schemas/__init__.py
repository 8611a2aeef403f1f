"""Typed events, the topic registry and the codec (docs/architecture.md: Events)."""

from rlbus.schemas.codec import DecodeError, decode, encode
from rlbus.schemas.events import (
    EVENT_TYPES,
    UNKNOWN_POLICY_VERSION,
    AnyEvent,
    DeadLetter,
    Event,
    Messages,
    RolloutCompleted,
    RolloutScored,
    TaskPublished,
    TokenRecord,
    TraceNode,
    TrainBatch,
    TrainSample,
    TrainStep,
    WeightLoaded,
    WeightVersion,
)
from rlbus.schemas.ids import derived_id, group_id_of, uuid7
from rlbus.schemas.topics import BY_NAME, TOPICS, Topic, group_of, key_of, topic_of

__all__ = [
    "BY_NAME",
    "EVENT_TYPES",
    "TOPICS",
    "AnyEvent",
    "DeadLetter",
    "DecodeError",
    "Event",
    "Messages",
    "RolloutCompleted",
    "RolloutScored",
    "TaskPublished",
    "TokenRecord",
    "UNKNOWN_POLICY_VERSION",
    "Topic",
    "TraceNode",
    "TrainBatch",
    "TrainSample",
    "TrainStep",
    "WeightLoaded",
    "WeightVersion",
    "decode",
    "derived_id",
    "group_id_of",
    "encode",
    "group_of",
    "key_of",
    "topic_of",
    "uuid7",
]
