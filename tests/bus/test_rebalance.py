"""Consumer-group membership on the real embedded broker: a member that stops cleanly leaves its
group at once (LeaveGroup), so its partitions move to the others without waiting for its
session to time out; a static member (kafka.group_instance_id) keeps its place across a
restart. How fast either happens is measured by bench/rebalance.py, not asserted here."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from rlbus.bus import Bus, Delivery
from rlbus.bus.connection import client_options
from rlbus.config import ConfigError, Settings, load_settings
from rlbus.schemas import TaskPublished

SESSION_MS = 6000
"""Long enough that no member of these tests can be taken out for silence between its stop and
the checks that follow it (milliseconds), short enough that Tansu's join hold (half of it)
keeps the tests short."""


def with_membership(settings: Settings, **kafka: object) -> Settings:
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(
                update={"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 500, **kafka}
            )
        }
    )


async def members(settings: Settings, group: str) -> list[str]:
    """The member ids the broker lists in `group` (DescribeGroups)."""
    admin = AIOKafkaAdminClient(**client_options(settings.kafka))
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([settings.kafka.topic_prefix + group])
    finally:
        await admin.close()
    (described,) = response.groups
    return [member[0] for member in described[5]]


def tasks(settings: Settings, n: int, start: int = 0) -> list[TaskPublished]:
    return [
        TaskPublished(task_id=f"t{i}", env="e", prompt="p", run_id=settings.run_id)
        for i in range(start, start + n)
    ]


class Member:
    """One subscriber of `group` on `tasks`, running until stopped; what it handled, by
    partition."""

    def __init__(self, bus: Bus, group: str):
        self.stop = asyncio.Event()
        self.partitions: set[int] = set()
        self.handled: list[str] = []

        async def handle(batch: list[Delivery]) -> None:
            for d in batch:
                self.partitions.add(d.partition)
                self.handled.append(d.event.task_id)  # type: ignore[attr-defined]

        self.task = asyncio.create_task(
            bus.subscriber("tasks", group=group, batch=True)(handle).run(self.stop)
        )

    async def stopped(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 30)


async def until(check, timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.05)


async def test_a_cleanly_stopped_member_leaves_its_group_at_once(settings: Settings) -> None:
    settings = with_membership(settings)
    async with Bus.of(settings) as bus:
        await bus.publish_many(tasks(settings, 4))
        member = Member(bus, "leaving")
        await until(lambda: len(member.handled) == 4)
        assert len(await members(settings, "leaving")) == 1
        await member.stopped()
        # Milliseconds after the stop: only a LeaveGroup can have taken it out of the group.
        assert await members(settings, "leaving") == []


async def test_partitions_of_a_stopped_member_go_to_the_other(settings: Settings) -> None:
    settings = with_membership(settings)
    async with Bus.of(settings) as bus:
        first, second = Member(bus, "pair"), Member(bus, "pair")
        n = 0
        while not (first.partitions and second.partitions):  # both hold a partition
            await bus.publish_many(tasks(settings, 8, n))
            n += 8
            await asyncio.sleep(0.5)
        await first.stopped()
        assert len(await members(settings, "pair")) == 1
        await bus.publish_many(tasks(settings, 8, n))
        await until(lambda: set(second.handled) >= {f"t{i}" for i in range(n, n + 8)})
        await second.stopped()
    assert second.partitions == set(range(settings.kafka.partitions))


@pytest.mark.slow
async def test_a_static_member_keeps_its_place_across_a_restart(settings: Settings) -> None:
    static = with_membership(settings, group_instance_id="worker-0")
    async with Bus.of(static) as bus:
        await bus.publish_many(tasks(settings, 4))
        member = Member(bus, "static")
        await until(lambda: len(member.handled) == 4)
        (before,) = await members(settings, "static")
        await member.stopped()
        # A static member sends no LeaveGroup: its place waits for it...
        assert await members(settings, "static") == [before]
        again = Member(bus, "static")
        await bus.publish_many(tasks(settings, 4, 4))
        await until(lambda: len(again.handled) == 4)
        # ...and a restart under the same instance id takes that place, not a new one.
        assert await members(settings, "static") == [before]
        await again.stopped()


def test_a_heartbeat_slower_than_the_session_is_refused_naming_both() -> None:
    with pytest.raises(
        ConfigError,
        match=r"kafka\.heartbeat_interval_ms = 3000 must be below kafka\.session_timeout_ms = 2000",
    ):
        load_settings(overrides=["--kafka.heartbeat-interval-ms", "3000"])
