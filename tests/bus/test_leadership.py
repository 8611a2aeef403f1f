"""One leader per run (bus.leadership): the assignor keeps leadership where it is, and on the
real broker a standby that joins takes nothing from a live leader, and takes over when the
leader leaves. (A SIGKILLed leader: tests/roles/test_orchestrator_standby.py.)"""

from __future__ import annotations

import asyncio
import time

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from rlbus.bus import Bus
from rlbus.bus.leadership import Leadership, _Assignor, _claim
from rlbus.config import Settings


def chosen(claims: dict[str, bytes]) -> str:
    """The member the assignor gives partition 0."""
    assignor = _Assignor(Leadership.__new__(Leadership))
    members = {m: ConsumerProtocolMemberMetadata(0, ["leaders"], c) for m, c in claims.items()}
    given = assignor.assign(ClusterMetadata(), members)
    (leader,) = [m for m, a in given.items() if a.assignment]
    return leader


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
                left = time.monotonic()
                await first.__aexit__(None, None, None)  # a clean stop leaves the group
                assert await asyncio.wait_for(waiting, 30)
                assert time.monotonic() - left < 15
        finally:
            await first.__aexit__(None, None, None)
