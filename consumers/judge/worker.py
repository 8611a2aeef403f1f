"""`rlbus worker judge`: consume `rollouts`, publish `scored`.

Rollouts are keyed by group_id, so a group's rollouts arrive on one partition, at one judge.
Task sets without group rewards are scored rollout by rollout; with group rewards a group waits
in memory until all `group_size` rollouts are in. Env producers publish a group's rollouts
together, so a group rarely straddles two polls; if this judge restarts while one does, the
members handled before the restart are not seen again and that group is not scored.
"""

from __future__ import annotations

import asyncio
import logging

from rlbus.bus import Bus, Delivery
from rlbus.config import Settings
from rlbus.consumers.judge.scoring import Scorer
from rlbus.producers.env.loader import Environment
from rlbus.schemas import RolloutCompleted

log = logging.getLogger(__name__)


def group_name(envs: list[Environment]) -> str:
    """One consumer group per set of environments: each such judge sees every rollout."""
    return "judge." + "+".join(sorted(env.id for env in envs))


class Judge:
    def __init__(self, envs: list[Environment], bus: Bus):
        self.scorers = {env.id: Scorer(env) for env in envs}
        self.bus = bus
        self.pending: dict[str, dict[int, RolloutCompleted]] = {}
        self.scored = 0

    def _ready(self, rollout: RolloutCompleted) -> list[RolloutCompleted] | None:
        if not self.scorers[rollout.env].needs_group:
            return [rollout]
        members = self.pending.setdefault(rollout.group_id, {})
        members[rollout.sample_index] = rollout
        if len(members) < rollout.group_size:
            return None
        return list(self.pending.pop(rollout.group_id).values())

    async def handle(self, deliveries: list[Delivery]) -> None:
        ready = []
        for delivery in deliveries:
            event = delivery.event
            if (isinstance(event, RolloutCompleted) and event.env in self.scorers
                    and (group := self._ready(event)) is not None):
                ready.append(group)
        results = await asyncio.gather(*(self.scorers[group[0].env].score(group) for group in ready))
        events = [e for scored in results for e in scored]
        if events:
            await self.bus.publish_many(events)
            self.scored += len(events)


async def run_judge(settings: Settings, envs: list[Environment], stop: asyncio.Event) -> Judge:
    async with Bus(settings) as bus:
        judge = Judge(envs, bus)
        await bus.consume(group_name(envs), ["rollouts"], on_batch=judge.handle, stop=stop)
    return judge
