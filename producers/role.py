"""The env producer role (`rlbus worker env`): consume `tasks` for its environment, run each
task's group of rollouts, publish traces, token records and rollouts."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rlbus.bus import Bus
from rlbus.bus.heap import heap_returned
from rlbus.bus.role import RoleSummary
from rlbus.bus.waiting import unless_stopped
from rlbus.clients.replicas import Roster
from rlbus.config import Settings
from rlbus.environment.loader import Environment
from rlbus.producers.interception import InterceptionServer, TokenBackend
from rlbus.producers.interception.backends import renderer_for
from rlbus.producers.producer import EnvProducer, following
from rlbus.producers.rollouts import RolloutRunner
from rlbus.schemas import group_of

log = logging.getLogger(__name__)


class EnvProducerRole:
    """Runs until `stop`. `renderer` (train mode) overrides the one built from model.tokenizer;
    `run_envs`: every environment of the run, when known (`rlbus run` passes them): the
    producer of the first of them dead-letters tasks naming none of them."""

    name = "env"
    reads = ("tasks",)
    writes = ("rollouts", "trace-nodes", "tokens")

    def __init__(
        self,
        settings: Settings,
        env: Environment,
        renderer: Any | None = None,
        run_envs: frozenset[str] = frozenset(),
    ):
        self.settings = settings
        self.env = env
        self.renderer = renderer
        self.run_envs = run_envs
        self.producer: EnvProducer | None = None

    def groups(self) -> list[str]:
        """One consumer group per run and environment: tasks of other environments are
        skipped, not taken."""
        return [group_of("env", self.settings.run_id, self.env.id)]

    def describe(self) -> str:
        c = self.env.config
        return (
            f"env producer {self.env.id}: {c.harness.kind} harness, {c.runtime.kind} runtime, "
            f"{c.model.mode} mode -> {c.model.base_url}"
        )

    async def run(self, stop: asyncio.Event) -> RoleSummary:
        settings, env = self.settings, self.env
        train = env.config.model.mode == "train"
        roster = Roster(settings.kafka.announce_every_s) if train else None
        renderer = self.renderer
        if train and renderer is None:
            # Off the event loop: a stop while the tokenizer loads ends the role at once.
            renderer = await unless_stopped(
                lambda: renderer_for(env.config.model), stop, "tokenizer"
            )
            if renderer is None:
                said = "env producer stopped while loading its tokenizer"
                return RoleSummary(self.name, said, finished=False)
        async with (
            Bus.of(settings) as bus,
            InterceptionServer.of(env.config, renderer, roster) as server,
            following(bus, settings.run_id, roster),
            heap_returned(),
        ):
            producer = self.producer = EnvProducer(
                env, bus, RolloutRunner(env, server), self.run_envs
            )
            # Tasks in flight: enough to keep max_concurrent_rollouts busy at the group size.
            concurrency = max(1, env.config.max_concurrent_rollouts // env.config.group_size)
            consume = bus.subscriber(
                "tasks", group=self.groups()[0], concurrency=concurrency, run=settings.run_id
            )(producer.handle)
            producer.skipped = consume.other_runs
            await consume.run(stop)
            backend = server.backend
            replicas = backend.replicas if isinstance(backend, TokenBackend) else None
            if replicas is not None and (replicas.retried or replicas.behind):
                log.info(
                    "%d model calls made again on another inference replica; %d sent to a "
                    "replica behind their task's version",
                    replicas.retried,
                    replicas.behind,
                )
        return RoleSummary(
            self.name,
            f"env producer stopped after {producer.rollouts:,} rollouts",
            figures={"rollouts": producer.rollouts, "skipped": dict(producer.skipped)},
        )
