"""The judge's work: rollouts in, scores out (its door: consumers/judge/role.py).

Rollouts are keyed by group_id, so a group's rollouts arrive on one partition, at one judge.
Task sets without group rewards are scored rollout by rollout; with group rewards a group waits
in memory until all `group_size` rollouts are in. Its messages are held uncommitted meanwhile
(`Delivery.hold`), so a judge that restarts sees the whole group again; a group still incomplete
after the environment's group_wait_s is scored as errors, so it never pins the commits. Such a
group is scored by a look (at each call, and every few seconds), not as a call's input: when
the broker does not take its scores, they wait for the next look instead of the call failing
(the subscriber would run it again on rollouts it has taken in).

Scores carry the scorer version of the environment's rules as this judge loaded them
(Scorer.version), and LLM judges' calls go out as trace nodes of the scoring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from functools import partial
from typing import cast

from aiokafka.errors import KafkaError

from rlbus.bus import Bus, Delivery, telemetry
from rlbus.bus.unsent import Outbox, Unsent
from rlbus.environment.loader import Environment
from rlbus.environment.scoring import Scorer, Scoring
from rlbus.schemas import RolloutCompleted

log = logging.getLogger(__name__)


class Judge:
    def __init__(self, envs: list[Environment], bus: Bus):
        self.scorers = {env.id: Scorer(env) for env in envs}
        self.bus = bus
        self.pending: dict[str, dict[int, Delivery]] = {}
        self.since: dict[str, float] = {}
        """When each pending group's first rollout arrived."""
        self.scored = 0
        self.incomplete = 0
        """Groups scored as errors because they never completed."""
        self.unsent: Unsent[Scoring] = Unsent()
        """Scores computed but not taken by the broker: an LLM judge asked again may grade
        otherwise."""
        self.expired = Outbox()
        """The error scores of groups past their wait, until the broker takes them."""
        self._looking = asyncio.Lock()
        """A call's look and the periodic one take turns (each would send the same group)."""

    def _ready(self, delivery: Delivery, rollout: RolloutCompleted) -> list[Delivery] | None:
        if not self.scorers[rollout.env].needs_group:
            return [delivery]
        self.since.setdefault(rollout.group_id, time.monotonic())
        members = self.pending.setdefault(rollout.group_id, {})
        members[rollout.sample_index] = delivery
        if len(members) < rollout.group_size:
            delivery.hold()
            return None
        del self.since[rollout.group_id]
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
        await self._score(ready)
        await self.expire()

    async def _score(self, groups: list[list[Delivery]], failed: str = "") -> None:
        """Score the groups, publish the scores, then let their messages be committed."""
        rollouts = [[cast(RolloutCompleted, d.event) for d in group] for group in groups]
        # A group's key: its rollouts' event ids, and why it failed (an expired group's scores
        # are errors), so a call made again finds the scores the first one computed.
        keys = ["\n".join([failed, *sorted(r.event_id for r in rs)]) for rs in rollouts]
        results = await asyncio.gather(
            *(
                self.unsent.computed(
                    key,
                    lambda rs=rs, group=group: self.scorers[rs[0].env].scoring(
                        rs, failed, **telemetry.joining(d.headers for d in group)
                    ),
                )
                for key, rs, group in zip(keys, rollouts, groups, strict=True)
            )
        )
        events = [e for scoring in results for e in scoring.events()]
        if events:
            traced = telemetry.enabled()
            parents = {k: v for s in results for k, v in s.parents().items()} if traced else None
            with self.unsent.kept_if_refused(dict(zip(keys, results, strict=True))):
                await self.bus.publish_many(events, parents)
            self.scored += sum(len(scoring.scored) for scoring in results)
        for group in groups:
            for delivery in group:
                delivery.release()

    async def expire(self) -> None:
        """Score as errors the groups that waited longer than their environment's group_wait_s
        for their missing rollouts; those the broker did not take go first at the next call."""
        async with self._looking:
            await self._expire()

    async def _expire(self) -> None:
        now = time.monotonic()
        for group_id, since in list(self.since.items()):
            members = list(self.pending[group_id].values())
            first = cast(RolloutCompleted, members[0].event)
            wait_s = self.scorers[first.env].env.config.group_wait_s
            if now - since < wait_s:
                continue
            del self.since[group_id], self.pending[group_id]
            self.incomplete += 1
            reason = (
                f"group incomplete: {len(members)} of {first.group_size} rollouts arrived within "
                f"group_wait_s = {wait_s:g}s"
            )
            log.warning("group %s of %s: %s", group_id, first.env, reason)
            self.expired.put(partial(self._score, [members], reason))
        try:
            await self.expired.send()
        except KafkaError as exc:
            log.warning(
                "the broker did not take the error scores of %d incomplete groups (%r); "
                "sent again at the next look",
                len(self.expired),
                exc,
            )

    async def keep_expiring(self, stop: asyncio.Event, every_s: float = 5.0) -> None:
        """Look for expired groups while no rollouts arrive to prompt it."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
            await self.expire()
