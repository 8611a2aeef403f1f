"""One leader per run (bus.leadership): the assignor keeps leadership where it is, and on the
real broker a standby that joins takes nothing from a live leader, and takes over when the
leader leaves (its LeaveGroup, not its session running out; how fast a group moves on is
measured by bench/rebalance.py). (A SIGKILLed leader: tests/roles/test_orchestrator_standby.py.)"""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from rlbus.bus import Bus
from rlbus.bus.connection import client_options
from rlbus.bus.leadership import Leadership, _Assignor, _claim
from rlbus.config import Settings

SESSION_MS = 6000
"""Long enough that the leader cannot be taken out of the group for silence between its stop
and the check that follows it (milliseconds): only its LeaveGroup can have."""


def chosen(claims: dict[str, bytes]) -> str:
    """The member the assignor gives partition 0."""
    assignor = _Assignor(Leadership.__new__(Leadership))
    members = {m: ConsumerProtocolMemberMetadata(0, ["leaders"], c) for m, c in claims.items()}
    given = assignor.assign(ClusterMetadata(), members)
    (leader,) = [m for m, a in given.items() if a.assignment]
    return leader


async def members(settings: Settings, group: str) -> int:
    """How many members the broker lists in `group` (DescribeGroups)."""
    admin = AIOKafkaAdminClient(**client_options(settings.kafka))
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([settings.kafka.topic_prefix + group])
    finally:
        await admin.close()
    (described,) = response.groups
    return len(described[5])


def test_the_assignor_keeps_the_leader_and_prefers_the_newest_claim() -> None:
    # No one leads yet: the member that joined first.
    assert chosen({"a": _claim(None, 20.0), "b": _claim(None, 10.0)}) == "b"
    # A standby that joined earlier never takes over from the member that leads.
    assert chosen({"a": _claim(None, 10.0), "b": _claim(30.0, 20.0)}) == "b"
    # A leader cut off from the group comes back still claiming: the newer leader keeps it.
    assert chosen({"old": _claim(30.0, 10.0), "new": _claim(45.0, 20.0)}) == "new"
    # A member whose claim cannot be read never wins.
    assert chosen({"x": b"garbage", "y": _claim(None, 99.0)}) == "y"


async def test_a_standby_waits_while_the_leader_lives_and_leads_once_it_leaves(
    settings: Settings,
) -> None:
    kafka = {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 500}
    settings = settings.model_copy(update={"kafka": settings.kafka.model_copy(update=kafka)})
    stop = asyncio.Event()
    async with Bus.of(settings) as bus:
        first = Leadership(bus, "leader-test")
        await first.__aenter__()
        try:
            assert await asyncio.wait_for(first.acquired(stop), 60)
            async with Leadership(bus, "leader-test") as second:
                waiting = asyncio.create_task(second.acquired(stop))
                # The rebalance its joining causes gives partition 0 back to the leader.
                await asyncio.sleep(8)  # past that rebalance (the broker waits 3 s for joins)
                assert first.leading and not waiting.done() and not first.lost.is_set()
                assert await members(settings, "leader-test") == 2
                await first.__aexit__(None, None, None)  # a clean stop leaves the group
                assert await members(settings, "leader-test") == 1  # at once: no session ran out
                assert await asyncio.wait_for(waiting, 60)
        finally:
            await first.__aexit__(None, None, None)
