"""The `batches` table names algorithms as the registry does (what a run config says), never by
their Python class: a batch published through the real broker is read back."""

from __future__ import annotations

import asyncio

from rlbus.bus import Bus
from rlbus.bus.topic_reader import read_back
from rlbus.config import Settings
from rlbus.config.orchestrator import AlgorithmConfig, OrchestratorConfig
from rlbus.consumers.orchestrator.algorithms import Context, make_algorithm
from rlbus.consumers.orchestrator.join import Joiner
from rlbus.consumers.orchestrator.orchestration import Orchestrator
from rlbus.consumers.orchestrator.staleness_gate import ReadyGroup
from rlbus.consumers.orchestrator.task_draw import TaskSource
from rlbus.schemas import TrainBatch, TrainSample
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens


def sample(rollout_id: str) -> TrainSample:
    return TrainSample(
        rollout_id=rollout_id,
        input_ids=pack_tokens([1, 2, 3]),
        loss_mask=pack_mask([0, 1, 1]),
        advantages=pack_logprobs([0.0, 0.5, 0.5]),
        inference_logprobs=pack_logprobs([0.0, -1.0, -1.0]),
    )


async def test_batches_carry_the_registry_names_of_their_groups_algorithms(
    settings: Settings,
) -> None:
    unused_teacher = Context(teacher=None)
    algorithms = {
        "distilled": make_algorithm(AlgorithmConfig(name="self-distill"), unused_teacher),
        "taught": make_algorithm(AlgorithmConfig(name="opd"), unused_teacher),
        "plain": make_algorithm(AlgorithmConfig(name="grpo")),
    }
    run = settings.run_id
    async with Bus.of(settings) as bus:
        o = Orchestrator(
            bus,
            OrchestratorConfig(tasks_per_step=1),
            run,
            max_steps=3,
            tasks=TaskSource([], run, 0.0, 0),
            algorithms=algorithms,
            joiner=Joiner(run, set(algorithms), lambda env: 1.0),
        )
        o.step = 0
        for env in ("distilled", "taught"):
            o.ready.append(ReadyGroup([sample(f"{env}-r")], [1.0], [f"{env}-r"], env))
            assert o._build_batch(1)
        await o.outbox.send()
        batches: list[TrainBatch] = []
        for _ in range(40):  # a new topic's end offsets can lag its first records
            batches = [e for e in await read_back(bus, "batches", run) if isinstance(e, TrainBatch)]
            if len(batches) >= 2:
                break
            await asyncio.sleep(0.25)
    # Each batch names the algorithm of the environment its groups came from.
    assert sorted((b.step, b.algorithm) for b in batches) == [(1, "self-distill"), (2, "opd")]
