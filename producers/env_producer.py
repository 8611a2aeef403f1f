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
from rlbus.producers.rollouts import RolloutRunner
from rlbus.schemas import TaskPublished, group_of


def group_name(env: Environment, run_id: str) -> str:
    """One consumer group per run and environment: tasks of other environments are skipped,
    not taken."""
    return group_of("env", run_id, env.id)


class EnvProducer:
    def __init__(self, env: Environment, bus: Bus, runner: RolloutRunner):
        self.env = env
        self.bus = bus
        self.runner = runner
        self.rollouts = 0
        self.skipped: Counter[str] = Counter()
        """Tasks of other runs seen and left alone, by run."""

    async def handle(self, delivery: Delivery) -> None:
        task = delivery.event
        if not isinstance(task, TaskPublished) or task.env != self.env.id:
            return
        outputs = await self.runner.run_group(task)
        await self.bus.publish_many([e for out in outputs for e in out.events()])
        self.rollouts += len(outputs)


async def run_env_producer(
    settings: Settings, env: Environment, stop: asyncio.Event, renderer: Any | None = None
) -> EnvProducer:
    """Run until `stop` is set. `renderer` (train mode) overrides the one built from
    model.tokenizer."""
    async with Bus.of(settings) as bus, InterceptionServer.of(env.config, renderer) as server:
        producer = EnvProducer(env, bus, RolloutRunner(env, server))
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
