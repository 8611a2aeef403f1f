"""An evaluation in one process: run each task's group, score it with the task set's rules, and
publish the task, the trace, the rollouts and the scores together. No consumer is involved, so
nothing waits on consumer-group joins; the events are the same a producer and a judge publish."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.trace import SpanKind

from rlbus.bus import Bus, telemetry
from rlbus.bus.unsent import until_taken
from rlbus.environment.scoring import Scorer
from rlbus.producers.rollouts import RolloutRunner, trace_parents
from rlbus.schemas import Event, RolloutScored, TaskPublished


@dataclass
class Tally:
    """Running totals for the progress display."""

    rollouts: int = 0
    errors: int = 0
    reward_sum: float = 0.0

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.rollouts if self.rollouts else 0.0

    def add(self, scored: list[RolloutScored]) -> None:
        self.rollouts += len(scored)
        self.reward_sum += sum(s.reward for s in scored)
        self.errors += sum(s.status != "ok" for s in scored)


class EvalPipeline:
    def __init__(
        self, runner: RolloutRunner, bus: Bus, on_group: Callable[[Tally], None] | None = None
    ):
        self.runner = runner
        self.scorer = Scorer(runner.env)
        self.bus = bus
        self.on_group = on_group
        self.tally = Tally()

    async def _task(self, task: TaskPublished) -> None:
        """One task's group, in one trace when telemetry is on: the task's span holds its
        rollouts (with their model calls) and their scoring."""
        attributes = {"rlbus.task_id": task.task_id, "rlbus.env": task.env}
        with telemetry.span(f"evaluate {task.env}", SpanKind.INTERNAL, attributes=attributes):
            outputs = await self.runner.run_group(task)
            rollouts = [o.rollout for o in outputs]
            scoring = await self.scorer.scoring(
                rollouts, linked=telemetry.links(o.context for o in outputs)
            )
            events: list[Event] = [task, *(e for o in outputs for e in o.events())]
            events += scoring.events()
            parents = trace_parents(outputs)
            if parents is not None:
                parents |= scoring.parents()
            # No consumer runs this again after a broker error: the same events are sent again.
            await until_taken(
                lambda: self.bus.publish_many(events, parents), f"task {task.task_id}'s publish"
            )
        self.tally.add(scoring.scored)
        if self.on_group is not None:
            self.on_group(self.tally)

    async def run(self, tasks: Iterable[TaskPublished]) -> Tally:
        """Run every task; at most max_concurrent_rollouts rollouts are in flight at once."""
        config = self.runner.env.config
        # Enough groups queued to keep every rollout slot busy, not the whole task set at once.
        groups = asyncio.Semaphore(max(2, 2 * config.max_concurrent_rollouts // config.group_size))
        running: set[asyncio.Task[None]] = set()
        failures: list[BaseException] = []

        def finished(t: asyncio.Task[None]) -> None:
            running.discard(t)
            groups.release()
            if not t.cancelled() and (failure := t.exception()) is not None:
                failures.append(failure)

        for task in tasks:
            await groups.acquire()
            if failures:
                break
            t = asyncio.create_task(self._task(task))
            running.add(t)
            t.add_done_callback(finished)
        if running:
            await asyncio.wait(running)
        await self.scorer.aclose()
        if failures:
            raise failures[0]
        return self.tally
