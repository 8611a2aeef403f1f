"""The judge role (`rlbus worker judge`): consume `rollouts` of its environments, publish
`scored` (group rewards once a group is complete)."""

from __future__ import annotations

import asyncio

from rlbus.bus import Bus
from rlbus.bus.heap import heap_returned
from rlbus.bus.role import RoleSummary
from rlbus.config import Settings
from rlbus.consumers.judge.judging import Judge
from rlbus.environment.loader import Environment
from rlbus.schemas import group_of


class JudgeRole:
    name = "judge"
    reads = ("rollouts",)
    writes = ("scored", "trace-nodes")

    def __init__(self, settings: Settings, envs: list[Environment]):
        self.settings = settings
        self.envs = envs
        self.judge: Judge | None = None
        """While it runs, and after: the handler, with its counts."""

    def groups(self) -> list[str]:
        """One consumer group per run and set of environments: each such judge sees every
        rollout."""
        envs = "+".join(sorted(env.id for env in self.envs))
        return [group_of("judge", self.settings.run_id, envs)]

    def describe(self) -> str:
        envs = ", ".join(e.id for e in self.envs)
        return f"judge for {envs} (run {self.settings.run_id!r})"

    async def run(self, stop: asyncio.Event) -> RoleSummary:
        async with Bus.of(self.settings) as bus, heap_returned():
            judge = self.judge = Judge(self.envs, bus)
            run_id = self.settings.run_id
            consume = bus.subscriber("rollouts", group=self.groups()[0], batch=True, run=run_id)
            expiring = asyncio.create_task(judge.keep_expiring(stop))
            try:
                await consume(judge.handle).run(stop)
            finally:
                expiring.cancel()
                for scorer in judge.scorers.values():
                    await scorer.aclose()
        return RoleSummary(
            self.name,
            f"judge stopped after scoring {judge.scored:,} rollouts",
            figures={"scored": judge.scored, "incomplete": judge.incomplete},
        )
