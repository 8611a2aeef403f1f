"""An env producer's work (its door: producers/role.py): for each task of its environment, run
the task's group of rollouts and publish every rollout's trace nodes, token records and the
rollouts, a group at a time (so a judge gets the group in one piece). In train mode it follows
the run's inference replicas as they announce themselves (bus.announcements), to route rollouts
to them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator

from rlbus.bus import Bus, Delivery
from rlbus.bus.announcements import follow_announcements
from rlbus.bus.unsent import Unsent
from rlbus.clients.replicas import Roster
from rlbus.environment.loader import Environment
from rlbus.producers.rollouts import RolloutOutput, RolloutRunner, trace_parents
from rlbus.schemas import TaskPublished

log = logging.getLogger(__name__)


class EnvProducer:
    def __init__(
        self,
        env: Environment,
        bus: Bus,
        runner: RolloutRunner,
        run_envs: frozenset[str] = frozenset(),
    ):
        """`run_envs`: every environment of the run, when known (`rlbus run` passes them): the
        producer of the first of them dead-letters tasks naming none of them."""
        self.env = env
        self.bus = bus
        self.runner = runner
        self.run_envs = run_envs
        self.rollouts = 0
        self.skipped: Counter[str] = Counter()
        """Tasks of other runs seen and left alone, by run."""
        self.unsent: Unsent[list[RolloutOutput]] = Unsent()
        """Groups that ran but whose publish the broker refused or timed out."""

    def _refusal(self, task: TaskPublished) -> str | None:
        """Why a task cannot be run, if it cannot; None for other environments' tasks."""
        if task.env != self.env.id:
            if (
                self.run_envs
                and self.env.id == min(self.run_envs)
                and task.env not in self.run_envs
            ):
                known = ", ".join(sorted(self.run_envs))
                return f"unknown env {task.env!r}: run {task.run_id!r} has only {known}"
            return None
        size, limit = task.group_size or self.env.config.group_size, self.env.config.max_group_size
        if size > limit:
            return f"group_size {size} is over {self.env.id}'s max_group_size {limit}"
        return None

    async def handle(self, delivery: Delivery) -> None:
        task = delivery.event
        if not isinstance(task, TaskPublished):
            return
        if (reason := self._refusal(task)) is not None:
            delivery.reject(f"task {task.task_id}: {reason}")
            return
        if task.env != self.env.id:
            return
        key = task.event_id
        outputs = await self.unsent.computed(key, lambda: self.runner.run_group(task))
        events = [e for out in outputs for e in out.events()]
        with self.unsent.kept_if_refused({key: outputs}):
            await self.bus.publish_many(events, trace_parents(outputs))
        self.rollouts += len(outputs)


@contextlib.asynccontextmanager
async def following(bus: Bus, run_id: str, roster: Roster | None) -> AsyncIterator[None]:
    """While inside: `roster` hears the run's inference replicas (nothing to do without one)."""
    if roster is None:
        yield
        return
    done = asyncio.Event()
    task = asyncio.create_task(follow_announcements(bus, run_id, roster.heard, done))
    try:
        yield
    finally:
        done.set()
        await asyncio.gather(task, return_exceptions=True)
