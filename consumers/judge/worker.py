"""`rlbus worker judge`: consume `rollouts`, publish `scored`.

Rollouts are keyed by group_id, so a group's rollouts arrive on one partition, at one judge.
Task sets without group rewards are scored rollout by rollout; with group rewards a group waits
in memory until all `group_size` rollouts are in. Its messages are held uncommitted meanwhile
(`Delivery.hold`), so a judge that restarts sees the whole group again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from rlbus.bus import Bus, Delivery
from rlbus.config import Settings
from rlbus.producers.environment.loader import Environment
from rlbus.producers.environment.scoring import Scorer
from rlbus.schemas import RolloutCompleted, group_of

log = logging.getLogger(__name__)


def group_name(envs: list[Environment], run_id: str) -> str:
    """One consumer group per run and set of environments: each such judge sees every rollout."""
    return group_of("judge", run_id, "+".join(sorted(env.id for env in envs)))


class Judge:
    def __init__(self, envs: list[Environment], bus: Bus):
        self.scorers = {env.id: Scorer(env) for env in envs}
        self.bus = bus
        self.pending: dict[str, dict[int, Delivery]] = {}
        self.scored = 0

    def _ready(self, delivery: Delivery, rollout: RolloutCompleted) -> list[Delivery] | None:
        if not self.scorers[rollout.env].needs_group:
            return [delivery]
        members = self.pending.setdefault(rollout.group_id, {})
        members[rollout.sample_index] = delivery
        if len(members) < rollout.group_size:
            delivery.hold()
            return None
        return list(self.pending.pop(rollout.group_id).values())

    async def handle(self, deliveries: list[Delivery]) -> None:
        ready: list[list[Delivery]] = []
        for delivery in deliveries:
            event = delivery.event
            if (
                isinstance(event, RolloutCompleted)
                and event.env in self.scorers
                and (group := self._ready(delivery, event)) is not None
            ):
                ready.append(group)
        rollouts = [[cast(RolloutCompleted, d.event) for d in group] for group in ready]
        results = await asyncio.gather(
            *(self.scorers[group[0].env].score(group) for group in rollouts)
        )
        events = [e for scored in results for e in scored]
        if events:
            await self.bus.publish_many(events)
            self.scored += len(events)
        for group in ready:
            for delivery in group:
                delivery.release()


async def run_judge(settings: Settings, envs: list[Environment], stop: asyncio.Event) -> Judge:
    async with Bus.of(settings) as bus:
        judge = Judge(envs, bus)
        group = group_name(envs, settings.run_id)
        consume = bus.subscriber("rollouts", group=group, batch=True, run=settings.run_id)
        await consume(judge.handle).run(stop)
    return judge
