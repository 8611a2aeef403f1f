"""What the orchestrator publishes when the broker does not take it (a request that timed out):
its batches, training tasks and held-out tasks are built from its state, which says they went
out (a step counted, groups taken from the ready ones, tasks counted in flight, an evaluation
pending). Each must go out as built at its next turn, against a real broker."""

from __future__ import annotations

from pathlib import Path

from support.broker_refusals import RefusingBus, handled, published
from support.factories import scored_group

from rlbus.bus import Bus, Delivery
from rlbus.bus.commits import Holds
from rlbus.config import Settings
from rlbus.config.orchestrator import AlgorithmConfig, OrchestratorConfig
from rlbus.consumers.orchestrator.algorithms import make_algorithm
from rlbus.consumers.orchestrator.join import Joiner
from rlbus.consumers.orchestrator.orchestration import Orchestrator
from rlbus.consumers.orchestrator.task_draw import TaskSource, WeightedEnvironment
from rlbus.environment import load_environment
from rlbus.schemas import TaskPublished, TrainBatch, group_id_of, topic_of

ENV = "reverse_text"


def orchestrator(bus: RefusingBus, run: str, eval_every: int = 0) -> Orchestrator:
    env = load_environment(
        str(Path(__file__).resolve().parents[2] / "examples" / ENV), {"args": {"n": 40}}
    )
    cfg = OrchestratorConfig(tasks_per_step=1, eval_every=eval_every, eval_tasks=2)
    o = Orchestrator(
        bus,  # type: ignore[arg-type]  # the bus, refusing
        cfg,
        run,
        max_steps=3,
        tasks=TaskSource([WeightedEnvironment(env, 1.0)], run, cfg.held_out_fraction, 0),
        algorithms={ENV: make_algorithm(AlgorithmConfig(name="grpo"))},
        joiner=Joiner(run, {ENV}, lambda env: 1.0),
    )
    o._on_version(0)  # the trainer announced its first version
    o.served = 0  # and inference serves it
    return o


async def test_a_batch_the_broker_refused_goes_out_once_with_its_step(settings: Settings) -> None:
    """Before: the refused batch was lost (its step counted, its groups gone from the ready
    ones, their pieces held uncommitted until a restart), and the handler, run again on the
    same deliveries, joined the group again and batched it as the next step."""
    run = settings.run_id
    group = scored_group(run, "g0", "t0", [[4, 5], [6, 7]], [0.0, 1.0], env=ENV)
    holds = Holds()
    deliveries = [Delivery(e, topic_of(e), 0, i, holds=holds) for i, e in enumerate(group)]
    async with Bus.of(settings) as real:
        o = orchestrator(RefusingBus(real, refusals=1), run)
        await handled(o.handle, deliveries)
        await o.tick()
        batches = [e for e in await published(real, "batches", run, 1) if isinstance(e, TrainBatch)]
    assert [(b.step, sorted(s.rollout_id for s in b.samples)) for b in batches] == [
        (1, sorted({e.rollout_id for e in group}))  # type: ignore[attr-defined]
    ]
    assert o.step == 1 and not o.held and holds.offsets("scored", 0) == []


async def test_tasks_and_an_evaluation_the_broker_refused_go_out_as_drawn(
    settings: Settings,
) -> None:
    """Before: the refused training tasks stayed counted in flight though none went out (a run
    that met this often enough stopped sending tasks), and the refused evaluation stayed
    pending, so the run never finished."""
    run = settings.run_id
    async with Bus.of(settings) as real:
        o = orchestrator(RefusingBus(real, refusals=2), run, eval_every=1)
        await handled(o.handle, [])  # the evaluation refused, the training tasks behind it
        await o.tick()  # the evaluation taken, the training tasks refused
        await o.tick()
        tasks = [e for e in await published(real, "tasks", run, 2) if isinstance(e, TaskPublished)]
    train = {group_id_of(t) for t in tasks if t.split != "test"}
    held_out = {group_id_of(t) for t in tasks if t.split == "test"}
    assert train and train == o.inflight
    assert held_out and held_out == o.evaluations[0].pending
