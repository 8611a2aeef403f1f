"""A run's first tasks wait for every inference replica it has (inference.url and urls, or the
replicas `rlbus run` starts), for at most inference.start_wait_s once one serves, against a
real broker. Before, they went as soon as one replica served: CI saw every rollout of a
two-replica `rlbus run` on one replica, the other having come up seconds after the tasks (the
whole run sampled in two seconds)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support.broker_refusals import published
from support.runs import EXAMPLE, run_config

from rlbus.bus import Bus, Delivery
from rlbus.clients import replicas
from rlbus.config import Settings
from rlbus.config.runs import RunConfig
from rlbus.consumers.orchestrator.build import build_orchestrator
from rlbus.consumers.orchestrator.orchestration import Orchestrator
from rlbus.schemas import TaskPublished, WeightLoaded, topic_of


def with_replicas(settings: Settings, tmp: Path, **inference: object) -> RunConfig:
    cfg = run_config(settings, Path("unused (grpo needs no tokenizer)"), tmp)
    return cfg.model_copy(update={"inference": cfg.inference.model_copy(update=inference)})


async def announce(o: Orchestrator, run: str, worker: str, version: int) -> None:
    event = WeightLoaded(run_id=run, worker_id=worker, version=version, url=f"http://{worker}/v1")
    await o.handle([Delivery(event, topic_of(event), 0, 0)])


@pytest.mark.parametrize(
    "inference",
    [
        {"replicas": 2},
        # What `rlbus run` gives its orchestrator: the first replica's URL (the policy's server
        # for self-distillation) beside the run's `replicas`. Counted as one replica, it let a
        # CI run's tasks go before the second came up (all 64 rollouts on the first).
        {"replicas": 2, "url": "http://first/v1"},
    ],
    ids=["replicas", "replicas-and-the-first-url"],
)
async def test_the_first_tasks_wait_until_every_replica_of_the_run_serves(
    settings: Settings, tmp_path: Path, inference: dict[str, object]
) -> None:
    run = settings.run_id
    async with Bus.of(settings) as bus:
        o = build_orchestrator(bus, with_replicas(settings, tmp_path, **inference), EXAMPLE)
        o._on_version(0)  # the trainer's first version
        await announce(o, run, "first", 0)
        await o.tick()
        assert (o.served, o.inflight) == (-1, set())
        await announce(o, run, "second", 0)
        tasks = await published(bus, "tasks", run, 1)
    assert o.served == 0 and tasks
    assert {t.min_policy_version for t in tasks if isinstance(t, TaskPublished)} == {0}


async def test_a_replica_that_never_comes_up_holds_the_start_back_only_start_wait_s(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = settings.run_id
    cfg = with_replicas(settings, tmp_path, urls=["http://a/v1", "http://b/v1"], start_wait_s=30)
    async with Bus.of(settings) as bus:
        o = build_orchestrator(bus, cfg, EXAMPLE)
        o._on_version(0)
        await announce(o, run, "a", 0)
        assert o.starting.first_up_at is not None
        o.starting.first_up_at -= 29  # as if that long ago
        await o.tick()
        assert o.inflight == set()
        o.starting.first_up_at -= 1
        with caplog.at_level(logging.WARNING, logger=replicas.__name__):
            await o.tick()
        tasks = await published(bus, "tasks", run, 1)
    assert o.served == 0 and tasks
    assert [r.getMessage() for r in caplog.records] == [
        "1 of the run's 2 inference replicas serve version 0 after 30s "
        "(inference.start_wait_s): starting with those; the others join when they announce "
        "themselves"
    ]
