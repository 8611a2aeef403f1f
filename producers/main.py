"""`rlbus worker env`: an env producer. Consumes `tasks` for its environment, runs each task's
group of rollouts, and publishes every rollout's trace nodes, token records and the rollouts,
a group at a time (so a judge gets the group in one piece). In train mode it follows the run's
inference replicas as they announce themselves (bus.announcements), to route rollouts to them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from rlbus.bus import Bus, Delivery
from rlbus.bus.announcements import follow_announcements
from rlbus.clients.replicas import Roster
from rlbus.config import Settings
from rlbus.environment.loader import Environment
from rlbus.producers.interception import InterceptionServer, TokenBackend
from rlbus.producers.rollouts import RolloutRunner, trace_parents
from rlbus.schemas import TaskPublished, group_of

log = logging.getLogger(__name__)


def group_name(env: Environment, run_id: str) -> str:
    """One consumer group per run and environment: tasks of other environments are skipped,
    not taken."""
    return group_of("env", run_id, env.id)


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
        outputs = await self.runner.run_group(task)
        events = [e for out in outputs for e in out.events()]
        await self.bus.publish_many(events, trace_parents(outputs))
        self.rollouts += len(outputs)


async def run(
    settings: Settings,
    env: Environment,
    stop: asyncio.Event,
    renderer: Any | None = None,
    run_envs: frozenset[str] = frozenset(),
) -> EnvProducer:
    """Run until `stop` is set. `renderer` (train mode) overrides the one built from
    model.tokenizer; `run_envs` are the run's environments (see EnvProducer)."""
    train = env.config.model.mode == "train"
    roster = Roster(settings.kafka.announce_every_s) if train else None
    async with (
        Bus.of(settings) as bus,
        InterceptionServer.of(env.config, renderer, roster) as server,
        following(bus, settings.run_id, roster),
    ):
        producer = EnvProducer(env, bus, RolloutRunner(env, server), run_envs)
        # Tasks in flight: enough to keep max_concurrent_rollouts busy at the configured group size.
        concurrency = max(1, env.config.max_concurrent_rollouts // env.config.group_size)
        consume = bus.subscriber(
            "tasks",
            group=group_name(env, settings.run_id),
            concurrency=concurrency,
            run=settings.run_id,
        )(producer.handle)
        producer.skipped = consume.other_runs
        await consume.run(stop)
        replicas = server.backend.replicas if isinstance(server.backend, TokenBackend) else None
        if replicas is not None and (replicas.retried or replicas.behind):
            log.info(
                "%d model calls made again on another inference replica; %d sent to a replica "
                "behind their task's version",
                replicas.retried,
                replicas.behind,
            )
    return producer


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
