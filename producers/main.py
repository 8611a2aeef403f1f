"""`rlbus worker env`: an env producer. Consumes `tasks` for its environment, runs each task's
group of rollouts, and publishes every rollout's trace nodes, token records and the rollouts,
a group at a time (so a judge gets the group in one piece)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from rlbus.bus import Bus, Delivery
from rlbus.config import Settings
from rlbus.producers.environment.loader import Environment
from rlbus.producers.interception import InterceptionServer
from rlbus.producers.rollouts import RolloutRunner, trace_parents
from rlbus.schemas import TaskPublished, group_of


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
    async with Bus.of(settings) as bus, InterceptionServer.of(env.config, renderer) as server:
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
    return producer
