"""Every event on the bus, defined once.

The ClickHouse tables, the Arrow insert columns and the topic registry all follow from
these Structs (see `rlbus.bus.store.ddl` and `rlbus.schemas.topics`). Fields added later
must carry defaults so that older producers' events still decode; unknown fields from
newer producers are ignored on decode.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, ClassVar

import msgspec

from rlbus.schemas.ids import uuid7
from rlbus.schemas.packed import LogProbs, Mask, TokenIds

SCHEMA_VERSION = 1
"""The newest event schema this code reads and writes. An event of a newer version is refused
(dead-lettered, naming both versions) rather than read as this one with its new fields lost."""

DEFAULT_RUN = "default"
"""The run of events that name none (e.g. JSON tasks from outside clients)."""

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""Every integer fits its Int64 column: a larger one is refused when decoded, not at insert."""
Timestamp = Annotated[float, msgspec.Meta(ge=0, le=1e10)]
"""Unix seconds, up to the year 2286 (what DateTime64(6) stores)."""
GroupSize = Annotated[int, msgspec.Meta(ge=0, le=2**16)]
"""Rollouts per task; environments bound it further (EnvConfig.max_group_size)."""

Messages = list[dict[str, Any]]
"""Chat messages in OpenAI form ({"role": ..., "content": ...}); stored as JSON."""


UNKNOWN_POLICY_VERSION = -1
"""The policy version of tokens from an endpoint that does not say which weights sampled them."""


class Event(msgspec.Struct, tag_field="kind", tag=True, kw_only=True, gc=False):
    """Fields every event carries.

    `gc=False`: an event never refers back to itself, so the garbage collector need not track
    it; the sink holds tens of thousands per batch, and tracking them made collections scan
    them all (a share of the sink's time per row docs/benchmarks.md records)."""

    table: ClassVar[str]
    order_by: ClassVar[tuple[str, ...]] = ("event_id",)

    event_id: str = msgspec.field(default_factory=uuid7)
    schema_version: int = SCHEMA_VERSION
    ts: Timestamp = msgspec.field(default_factory=time.time)
    run_id: str = ""


class TaskPublished(Event, kw_only=True):
    """A task for an environment; the unit of work that env producers turn into rollouts."""

    table = "tasks"
    order_by = ("task_id", "event_id")

    task_id: str
    env: str
    prompt: Messages | str
    answer: str = ""
    info: dict[str, Any] = {}
    group_size: GroupSize = 0
    """Rollouts to run for this task; 0 means the environment's configured default."""
    split: str = "train"
    min_policy_version: Int64 = 0
    """Sample with weights of at least this version: what the orchestrator counted as served
    when it published the task. Env producers route the task's rollouts to inference replicas
    serving it (a replica behind it is skipped while another serves it). 0: any."""


class RolloutEvent(Event, kw_only=True):
    """Fields that place an event in its rollout, group and task."""

    rollout_id: str
    group_id: str
    task_id: str
    env: str
    sample_index: Int64 = 0
    group_size: Int64 = 1


class RolloutCompleted(RolloutEvent, kw_only=True):
    """One finished (or errored) attempt at a task by one harness."""

    table = "rollouts"
    order_by = ("rollout_id", "event_id")

    prompt: Messages | str = ""
    completion: Messages = []
    answer: str = ""
    info: dict[str, Any] = {}
    status: str = "ok"
    """"ok" or "error"."""
    error: str = ""
    error_kind: str = ""
    model: str = ""
    harness: str = ""
    num_turns: Int64 = 0
    prompt_tokens: Int64 = 0
    completion_tokens: Int64 = 0
    min_policy_version: Int64 = 0
    max_policy_version: Int64 = 0
    duration_s: float = 0.0
    tools: Messages = []
    """The tools offered to the model (OpenAI function-tool form): each distinct one of the
    rollout's calls, in the order first offered."""


class TraceNode(Event, kw_only=True):
    """A message in a rollout's trace graph; branches (sub-agents, parallel calls) share parents."""

    table = "trace_nodes"
    order_by = ("rollout_id", "node_id", "event_id")

    node_id: str
    rollout_id: str
    parent_id: str = ""
    branch_id: str = "main"
    index: Int64 = 0
    role: str = ""
    message: dict[str, Any] = {}
    token_ids: TokenIds = b""
    """Tokens this node adds to its branch's context (the delta over its parent)."""
    sampled: bool = False
    """True when token_ids were sampled by the policy (they carry loss), False for context."""
    call_index: Int64 = -1


class TokenRecord(Event, kw_only=True):
    """Exact ids and log-probs of one model call, as the inference backend saw them."""

    table = "tokens"
    order_by = ("rollout_id", "call_index", "event_id")

    rollout_id: str
    group_id: str = ""
    call_index: Int64 = 0
    node_id: str = ""
    model: str = ""
    prompt_ids: TokenIds = b""
    completion_ids: TokenIds = b""
    logprobs: LogProbs = b""
    policy_version: Int64 = 0
    """The weights version that sampled the completion's first token, as the inference server
    said; UNKNOWN_POLICY_VERSION (-1) for an endpoint that does not say (any but rlbus's)."""
    replica: str = ""
    """The /v1 URL of the inference replica that answered the call (train mode; '' otherwise):
    with several replicas, which one sampled these tokens."""
    finish_reason: str = ""
    duration_s: float = 0.0
    """Seconds the model call took (the backend's answer, not the harness around it); `ts` is
    when it ended. 0 when not measured."""


class RolloutScored(RolloutEvent, kw_only=True):
    """A rollout's rewards and metrics, from a judge."""

    table = "scored"
    order_by = ("rollout_id", "event_id")

    reward: float = 0.0
    """The weighted sum of `rewards`."""
    rewards: dict[str, float] = {}
    metrics: dict[str, float] = {}
    status: str = "ok"
    error: str = ""
    policy_version: Int64 = 0
    completion_tokens: Int64 = 0
    scorer_version: str = ""
    """Which scoring this is: the judge's rules digest (`rules-1a2b3c4d`), or the name given to
    `rlbus rescore --as`; '' for scores from before versions. A rollout has one score per
    version."""


class TrainSample(msgspec.Struct, kw_only=True):
    """One packed training sequence: what the trainer sees, with no notion of the algorithm."""

    rollout_id: str
    input_ids: TokenIds
    loss_mask: Mask
    advantages: LogProbs
    """Per-token advantages, float32 packed like log-probs."""
    inference_logprobs: LogProbs
    teacher_logprobs: LogProbs = b""
    policy_version: Int64 = 0
    temperature: float = 1.0


class TrainBatch(Event, kw_only=True):
    """A training step's worth of samples from the orchestrator or `rlbus replay`."""

    table = "batches"
    order_by = ("batch_id", "event_id")

    batch_id: str
    step: Int64
    samples: list[TrainSample] = []
    algorithm: str = "grpo"
    loss: str = ""
    num_tokens: Int64 = 0
    min_policy_version: Int64 = 0
    max_policy_version: Int64 = 0
    dropped_stale: Int64 = 0
    """Samples the orchestrator left out of this batch: sampled more than max_off_policy_steps
    versions before the policy this batch trains."""
    metrics: dict[str, float] = {}
    """The orchestrator's counts since the previous batch (groups, rollouts errored, groups
    dropped for zero signal, samples too long) and the mean reward of the batch's groups."""


class WeightVersion(Event, kw_only=True):
    """New policy weights, written by the trainer; inference reloads them."""

    table = "weight_versions"
    order_by = ("version", "event_id")

    version: Int64
    step: Int64 = 0
    uri: str
    format: str = "safetensors"
    num_params: Int64 = 0


class WeightLoaded(Event, kw_only=True):
    """An inference worker now serves `version`."""

    table = "weights_loaded"
    order_by = ("version", "worker_id", "event_id")

    version: Int64
    worker_id: str
    load_s: float = 0.0
    uri: str = ""
    url: str = ""
    """The worker's /v1 URL as env producers reach it: how they find the replicas of a run
    (the worker re-publishes this event while it serves, so the announcement is also its
    heartbeat). '' from workers that do not say."""


class TrainStep(Event, kw_only=True):
    """Trainer metrics for one optimizer step."""

    table = "train_steps"
    order_by = ("step", "event_id")

    step: Int64
    loss: float = 0.0
    grad_norm: float = 0.0
    entropy: float = 0.0
    lr: float = 0.0
    mismatch_kl: float = 0.0
    """Mean KL between trainer and inference log-probs on the sampled tokens."""
    num_samples: Int64 = 0
    num_tokens: Int64 = 0
    tokens_per_s: float = 0.0
    dropped_stale: Int64 = 0
    """Samples of this step's batch dropped as stale, by the orchestrator or the trainer."""
    staleness: dict[str, Int64] = {}
    """Histogram: versions behind the trainer -> sample count."""
    metrics: dict[str, float] = {}


class DeadLetter(Event, kw_only=True):
    """A message a consumer could not decode or handle, kept whole with the reason."""

    table = "dead_letters"
    order_by = ("origin_topic", "origin_partition", "origin_offset", "event_id")

    origin_topic: str
    origin_partition: Int64
    origin_offset: Int64
    consumer_group: str
    error: str
    raw: bytes = b""
    key: bytes = b""


class HealthSample(Event, kw_only=True):
    """What `rlbus run` measured of its run at one moment (every health.sample_every_s): the
    memory of each of its processes and how far behind each of its consumer groups is."""

    table = "health_samples"

    rss_mib: dict[str, float] = {}
    """Resident memory (VmRSS) by process, in MiB: the process's log name (env, env-2), the
    embedded broker as "broker"."""
    lag: dict[str, Int64] = {}
    """Messages behind by consumer group (end offsets minus committed offsets, over the
    partitions it commits in): the run's groups and the shared sink's."""


class RunIncident(Event, kw_only=True):
    """Something that happened to a run, at `ts`, that whoever watches it should see without
    reading logs: a role that exited or restarted, the embedded broker rotated."""

    table = "incidents"

    incident: str
    """What happened: "role-exited", "role-restarted", "broker-rotation", "teacher" (a
    distillation teacher the run serves, named by its stored version), ..."""
    detail: str = ""
    """For a person: "rss 812 MB > 768 MB; 1,204 messages carried; paused 14.2 s"."""
    process: str = ""
    """The process it happened to (its log name: env-2); '' for the run as a whole."""


EVENT_TYPES: tuple[type[Event], ...] = (
    TaskPublished,
    RolloutCompleted,
    TraceNode,
    TokenRecord,
    RolloutScored,
    TrainBatch,
    WeightVersion,
    WeightLoaded,
    TrainStep,
    DeadLetter,
    HealthSample,
    RunIncident,
)

AnyEvent = (
    TaskPublished
    | RolloutCompleted
    | TraceNode
    | TokenRecord
    | RolloutScored
    | TrainBatch
    | WeightVersion
    | WeightLoaded
    | TrainStep
    | DeadLetter
    | HealthSample
    | RunIncident
)
