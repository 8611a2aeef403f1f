"""The topic registry: which events travel where, keyed by what (docs/architecture.md's topic
table)."""

from __future__ import annotations

from dataclasses import dataclass

from rlbus.schemas.events import (
    DeadLetter,
    Event,
    HealthSample,
    RolloutCompleted,
    RolloutScored,
    RunIncident,
    TaskPublished,
    TokenRecord,
    TraceNode,
    TrainBatch,
    TrainStep,
    WeightLoaded,
    WeightVersion,
)


@dataclass(frozen=True)
class Topic:
    name: str
    """Name without the configured prefix."""
    key_field: str
    """Event field used as the Kafka key: equal keys land on one partition."""
    kinds: tuple[type[Event], ...]
    groups: tuple[str, ...] = ("sink",)
    """The rlbus roles that read this topic (their groups are `role.run...`: schemas.group_of)."""
    accepts_json: bool = False
    """Outside clients may publish JSON here (no rlbus code needed)."""
    batched: bool = False
    """A message may hold several events of one key (a msgpack array): what one rollout
    produces in one publish travels as one message. Every rlbus reader of the topic takes
    arrays; per-event readers see one event at a time (Delivery.index numbers them)."""
    read_back: bool = False
    """A restarting role reads it back from its start, outside any group (the orchestrator its
    run's batches and versions): a broker handover keeps what it may be asked about."""


TOPICS: tuple[Topic, ...] = (
    Topic("tasks", "task_id", (TaskPublished,), ("env", "sink"), accepts_json=True),
    Topic("rollouts", "group_id", (RolloutCompleted,), ("judge", "orchestrator", "sink")),
    Topic("trace-nodes", "rollout_id", (TraceNode,), ("orchestrator", "sink"), batched=True),
    Topic("tokens", "rollout_id", (TokenRecord,), ("orchestrator", "sink"), batched=True),
    Topic("scored", "group_id", (RolloutScored,), ("orchestrator", "sink")),
    Topic("batches", "run_id", (TrainBatch,), ("trainer", "sink"), read_back=True),
    Topic(
        "weights",
        "run_id",
        (WeightVersion, WeightLoaded),
        ("inference", "orchestrator", "sink"),
        read_back=True,
    ),
    Topic("steps", "run_id", (TrainStep,)),
    Topic("dlq", "key", (DeadLetter,)),
    Topic("health", "run_id", (HealthSample, RunIncident)),
)

BY_NAME: dict[str, Topic] = {t.name: t for t in TOPICS}
BY_KIND: dict[type[Event], Topic] = {kind: t for t in TOPICS for kind in t.kinds}


def group_of(role: str, run_id: str, *parts: str) -> str:
    """A role's consumer group: one per run (a role serves the run it was started for; in a
    group shared by two runs each member would skip, and commit past, the other's events)."""
    return ".".join((role, run_id, *parts))


def topic_of(event: Event | type[Event]) -> Topic:
    kind = event if isinstance(event, type) else type(event)
    return BY_KIND[kind]


def key_of(event: Event) -> bytes:
    value = getattr(event, topic_of(event).key_field)
    return value if isinstance(value, bytes) else str(value).encode()
