"""One leader among the processes of a role that must run once per run (the orchestrator):
whoever holds partition 0 of the `leaders` topic in the role's own consumer group leads; the
others wait as standbys and one of them takes over when the leader's membership ends (a clean
stop at once, a crash after the session timeout).

The Kafka group protocol alone decides, so it works on any Kafka-protocol broker (the embedded
Tansu included, which has no transactions to fence with): the members' own assignor, run by
the group's elected member, gives partition 0 to the member that says it leads (the one that
became leader last, should a leader cut off from the group come back and still say so), else
to the member that joined first. A standby joining never takes over from a live leader, as a
round-robin assignment would half of the time. Between the coordinator giving the partition to
another member and a cut-off leader hearing of it (its next heartbeat,
kafka.heartbeat_interval_ms), both may believe they lead: the leader stops publishing as soon as
a rebalance begins (`leading`), and the orchestrator's batches carry ids derived from their
step, which the trainer trains once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from rlbus.bus.connection import client_options
from rlbus.bus.membership import group_options, leave_first_generation

if TYPE_CHECKING:
    from rlbus.bus.bus import Bus

log = logging.getLogger(__name__)

TOPIC = "leaders"
"""Not an event topic: nothing is written to it; its partition 0 is the token of leadership."""


def _claim(leading_since: float | None, joined: float) -> bytes:
    return f"{leading_since or 0.0:.6f} {joined:.6f}".encode()


def _parse(user_data: bytes) -> tuple[float, float]:
    try:
        leading_since, joined = (float(x) for x in user_data.decode().split())
    except ValueError:
        return 0.0, float("inf")  # a member that says nothing usable never wins
    return leading_since, joined


class _Assignor:
    """Partition 0 to the member that leads, else to the earliest; nothing to the others."""

    name = "rlbus-leader"
    version = 0

    def __init__(self, leadership: Leadership):
        self.leadership = leadership

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        claim = _claim(self.leadership.leading_since, self.leadership.joined)
        return ConsumerProtocolMemberMetadata(self.version, list(topics), claim)

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        claims = {m: _parse(meta.user_data) for m, meta in members.items()}
        leader = max(claims, key=lambda m: (claims[m][0], -claims[m][1], m))
        topic = next(iter(members[leader].subscription))
        return {
            m: ConsumerProtocolMemberAssignment(
                self.version, [(topic, [0])] if m == leader else [], b""
            )
            for m in members
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        """The listener acts on assignments (Leadership.on_partitions_assigned)."""


class Leadership(ConsumerRebalanceListener):
    """`async with Leadership(bus, group) as lead:` then `await lead.acquired(stop)`; `lead.lost`
    is set if another member takes over."""

    def __init__(self, bus: Bus, group: str):
        self.bus = bus
        self.group = group
        self.joined = time.time()
        self.leading = False
        """Holds partition 0 now (False during a rebalance, until it is given back)."""
        self.leading_since: float | None = None
        """When this member became leader; None while it is a standby."""
        self.gained = asyncio.Event()
        """Set while this member leads (from its assignment of partition 0 to its loss)."""
        self.lost = asyncio.Event()
        """Set when an assignment gives partition 0 to another member after this one led;
        cleared when this one leads again."""
        self._polling: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None

    # aiokafka calls these around each rebalance.
    def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self.leading = False

    def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self.leading = any(tp.partition == 0 for tp in assigned)
        if self.leading and self.leading_since is None:
            self.leading_since = time.time()
            log.info("%s: this process leads now", self.group)
            self.lost.clear()
            self.gained.set()
        elif not self.leading and self.leading_since is not None:
            self.leading_since = None
            log.warning("%s: another process leads now; this one stops", self.group)
            self.gained.clear()
            self.lost.set()

    async def acquired(self, stop: asyncio.Event) -> bool:
        """Wait until this process leads (True) or `stop` is set (False); raises what stopped
        its membership, if that failed."""
        assert self._polling is not None, "use `async with Leadership(...)`"
        gained = asyncio.create_task(self.gained.wait())
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait(
                {gained, stopped, self._polling}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            gained.cancel()
            stopped.cancel()
        if self._polling.done():
            self._polling.result()
        return self.gained.is_set()

    async def __aenter__(self) -> Leadership:
        await self.bus.topics.ensure([TOPIC])
        # The role's session and heartbeat (a leader killed without leaving is replaced a session
        # timeout after its last heartbeat); never static: a static leader would keep its place,
        # and leadership, until its session ran out even on a clean stop.
        membership: dict[str, Any] = {**group_options(self.bus.kafka), "group_instance_id": None}
        consumer = AIOKafkaConsumer(
            **client_options(self.bus.kafka),
            group_id=self.bus.kafka.topic_prefix + self.group,
            enable_auto_commit=False,
            partition_assignment_strategy=(_Assignor(self),),
            **membership,
        )
        consumer.subscribe([self.bus.topics.name(TOPIC)], listener=self)
        await consumer.start()
        self._consumer = consumer
        self._polling = asyncio.create_task(self._poll(consumer))
        return self

    async def _poll(self, consumer: AIOKafkaConsumer) -> None:
        """Membership needs a poll now and then (max.poll.interval.ms); nothing is read. A
        consumer that fails is no member any more: leadership is lost with it."""
        try:
            while True:
                consumer.pause(*consumer.assignment())
                await consumer.getmany(timeout_ms=500)
        except Exception:
            log.exception("%s: the leadership consumer failed", self.group)
            self.on_partitions_assigned([])
            raise

    async def __aexit__(self, *exc: object) -> None:
        polling, consumer, self._polling, self._consumer = self._polling, self._consumer, None, None
        if polling is not None:
            polling.cancel()
            await asyncio.gather(polling, return_exceptions=True)
        if consumer is not None:
            # Leaves the group: a standby takes over at the next rebalance, not after a timeout.
            await leave_first_generation(consumer)
            await consumer.stop()
