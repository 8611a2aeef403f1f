"""`rlbus worker orchestrator`: scored rollouts in, TrainBatches and tasks out.

One consumer (one group join) reads trace-nodes, tokens, rollouts, scored and weights. Steps
are counted by the trainer's versions: batch s is trained on version s-1, so a sample's
staleness is known when its batch is packed, and the trainer's first WeightVersion (which it
publishes on start, resumed or not) tells where the run stands.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from opentelemetry.trace import SpanKind

from rlbus.bus import Bus, Delivery, telemetry
from rlbus.bus.topic_reader import read_back
from rlbus.config.orchestrator import OrchestratorConfig
from rlbus.consumers.orchestrator.algorithms import Algorithm
from rlbus.consumers.orchestrator.join import Group, Joiner
from rlbus.consumers.orchestrator.pacing import Pacer
from rlbus.consumers.orchestrator.task_draw import EVAL_VERSION, SPLIT, TaskSource
from rlbus.producers.environment.judges import JUDGE_BRANCH
from rlbus.schemas import (
    TaskPublished,
    TraceNode,
    TrainBatch,
    TrainSample,
    WeightLoaded,
    WeightVersion,
    derived_id,
    group_id_of,
    group_of,
)
from rlbus.schemas.packed import logprobs, mask, tokens
from rlbus.schemas.staleness import filter_stale

log = logging.getLogger(__name__)

GROUP = "orchestrator"
TOPICS = ["trace-nodes", "tokens", "rollouts", "scored", "weights"]


@dataclass
class Counts:
    groups: int = 0
    samples: int = 0
    dropped_stale: int = 0
    dropped_zero_signal: int = 0
    dropped_too_long: int = 0
    errored_rollouts: int = 0
    untrainable: int = 0
    incomplete: int = 0
    """Rollouts whose pieces did not all arrive within orchestrator.incomplete_after_s."""


@dataclass
class ReadyGroup:
    samples: list[TrainSample]
    rewards: list[float]
    rollout_ids: list[str]
    env: str = ""
    """The environment the group came from: its algorithm names the batch."""

    @property
    def oldest_version(self) -> int:
        return min(s.policy_version for s in self.samples)


def take_oldest(ready: list[ReadyGroup], groups: int) -> tuple[list[ReadyGroup], list[ReadyGroup]]:
    """The `groups` sampled longest ago (in arrival order among equals), and the rest. Rollouts
    come back out of order: a group near the staleness bound goes into this batch before it
    expires, while a fresher one can wait a step."""
    ordered = sorted(ready, key=lambda g: g.oldest_version)
    return ordered[:groups], ordered[groups:]


@dataclass
class HeldOutEval:
    version: int
    pending: set[str]
    rewards: list[float] = field(default_factory=list)

    @property
    def pass_rate(self) -> float:
        return float(np.mean([r >= 1 for r in self.rewards])) if self.rewards else 0.0


def has_signal(samples: list[TrainSample]) -> bool:
    return any(np.any(logprobs(s.advantages)[mask(s.loss_mask) > 0] != 0) for s in samples)


class Orchestrator:
    def __init__(
        self,
        bus: Bus,
        cfg: OrchestratorConfig,
        run_id: str,
        max_steps: int,
        tasks: TaskSource,
        algorithms: dict[str, Algorithm],
        joiner: Joiner,
    ):
        self.bus = bus
        self.cfg = cfg
        self.run_id = run_id
        self.max_steps = max_steps
        self.tasks = tasks
        self.algorithms = algorithms
        self.joiner = joiner
        self.pacer = Pacer(cfg.tasks_per_step, cfg.max_off_policy_steps, cfg.max_inflight_tasks)
        self.step: int | None = None
        """Batches published so far; None until the trainer has announced its version."""
        self.served = -1
        self.trained = -1
        """Newest version the trainer announced: the run is done when it reaches max_steps."""
        self.inflight: set[str] = set()
        self.ready: list[ReadyGroup] = []
        self.start_version = 0
        """The trainer's first announced version: no task goes out before inference serves it."""
        self.awaiting_version = 0
        """sync: the version inference must serve before the next step's tasks go out."""
        self.collecting = False
        """sync: this step's tasks are out; its batch goes when all have come back."""
        self.evaluations: dict[int, HeldOutEval] = {}
        self.next_eval: int | None = None
        self.counts = Counts()
        self.counted = Counts()
        """`counts` when the last batch went out: each batch reports what happened since."""
        self.done = asyncio.Event()
        self.held: dict[str, list[Delivery]] = {}
        """Deliveries of rollouts not yet batched, evaluated or dropped, by rollout id: held
        uncommitted, so a restart finds them again."""
        self.batched: set[str] = set()
        """Rollouts in batches published so far (by this process or, read back, its
        predecessors): never batched again."""
        self.published_step = 0
        """The newest step of those batches."""

    def resume(self, batches: list[TrainBatch]) -> None:
        """Learn what earlier orchestrators of the run published (bus.replay.read_back)."""
        for batch in batches:
            self.batched.update(s.rollout_id for s in batch.samples)
            self.published_step = max(self.published_step, batch.step)
        if batches:
            log.info(
                "%d batches of run %s were published before, up to step %d",
                len(batches),
                self.run_id,
                self.published_step,
            )

    # -- events ----------------------------------------------------------------------

    async def handle(self, deliveries: list[Delivery]) -> None:
        for d in deliveries:
            event = d.event
            if isinstance(event, WeightVersion):
                self._on_version(event.version)
            elif isinstance(event, WeightLoaded):
                self.served = max(self.served, event.version)
            elif isinstance(event, TraceNode) and event.branch_id == JUDGE_BRANCH:
                continue  # an LLM judge's call behind a score: not the policy's to train on
            elif getattr(event, "rollout_id", "") not in self.batched:
                d.hold()
                self.held.setdefault(event.rollout_id, []).append(d)  # type: ignore[attr-defined]
                self.joiner.add(event)
        for group in self.joiner.ready():
            await self._on_group(group)
        expired = self.joiner.expired(self.cfg.incomplete_after_s)
        if expired:
            self.counts.incomplete += len(expired)
            log.warning(
                "%d rollouts still incomplete after %gs (pieces never arrived); dropped",
                len(expired),
                self.cfg.incomplete_after_s,
            )
            self._release(expired)
        await self.advance()

    def _release(self, rollout_ids: Iterable[str]) -> None:
        """Done with these rollouts (batched, evaluated or dropped): commit past them."""
        for rollout_id in rollout_ids:
            for delivery in self.held.pop(rollout_id, ()):
                delivery.release()

    def _on_version(self, version: int) -> None:
        self.trained = max(self.trained, version)
        if self.step is None:  # the trainer's announcement on start, fresh or resumed
            # A predecessor may have published batches the trainer has not trained yet.
            step = max(version, self.published_step)
            self.step = self.start_version = self.awaiting_version = step
            # A restart evaluates on the eval_every grid only: the versions before it were
            # evaluated by its predecessor (the final one is always evaluated).
            self.next_eval = step if step == 0 else self._eval_after(step)
            self.tasks.skip(step * self.cfg.tasks_per_step)
            log.info("trainer is at version %d; next batch is step %d", version, step + 1)

    async def _on_group(self, group: Group) -> None:
        rollout_ids = [m.rollout.rollout_id for m in group.members]
        try:
            kept = await self._trainable(group)
        except BaseException:
            self._release(rollout_ids)
            raise
        if kept:
            rewards = [m.scored.reward for m in group.members]
            self.ready.append(ReadyGroup(kept, rewards, rollout_ids, group.env))
        else:
            self._release(rollout_ids)

    async def _trainable(self, group: Group) -> list[TrainSample]:
        """The group's samples to train on; none for a held-out group (its rewards go to its
        evaluation) or one dropped (counted)."""
        first = group.members[0].rollout
        self.counts.errored_rollouts += sum(m.scored.status != "ok" for m in group.members)
        self.counts.untrainable += group.untrainable
        if first.info.get(SPLIT) == "test":
            evaluation = self.evaluations.get(int(first.info.get(EVAL_VERSION, -1)))
            if evaluation is not None and group.group_id in evaluation.pending:
                evaluation.pending.discard(group.group_id)
                evaluation.rewards.extend(m.scored.reward for m in group.members)
                if not evaluation.pending:
                    log.info(
                        "eval at version %d: mean reward %.3f, pass rate %.3f over %d rollouts",
                        evaluation.version,
                        float(np.mean(evaluation.rewards)),
                        evaluation.pass_rate,
                        len(evaluation.rewards),
                    )
            return []
        self.inflight.discard(group.group_id)
        samples = await self.algorithms[group.env].samples(group.members)
        kept = [s for s in samples if len(tokens(s.input_ids)) <= self.cfg.seq_len]
        self.counts.dropped_too_long += len(samples) - len(kept)
        self.counts.groups += 1
        if self.cfg.drop_zero_signal and not has_signal(kept):
            self.counts.dropped_zero_signal += 1
            kept = []
        errored = all(m.scored.status != "ok" for m in group.members)
        was_failing = self.pacer.failing
        self.pacer.observe(bool(kept), errored)
        if self.pacer.failing and not was_failing:
            log.warning(
                "most recent groups errored whole (%s); backing off to %d tasks in flight",
                group.members[0].scored.error[:200],
                self.pacer.max_inflight(),
            )
        return kept

    # -- pacing (pacing.Pacer) and batching ---------------------------------------------------

    async def advance(self) -> None:
        if self.step is None:
            return  # the trainer has not announced its version yet
        await self._maybe_evaluate()
        if self.cfg.mode == "async":
            while len(self.ready) >= self.cfg.tasks_per_step and self.step < self.max_steps:
                await self._publish_batch(self.cfg.tasks_per_step)
            if (
                self.served >= self.start_version
            ):  # on a resume, inference first loads the trainer's weights
                await self._publish_tasks(
                    self.pacer.room(
                        self.step, self.max_steps, len(self.ready), len(self.inflight), self.served
                    )
                )
        elif self.step < self.max_steps:
            if self.collecting:
                # Every group of the step is back (some may have been dropped). With nothing to
                # train on, the step gets another round of tasks instead of an empty batch.
                if not self.inflight and not await self._publish_batch(len(self.ready)):
                    await self._publish_tasks(self.cfg.tasks_per_step)
                elif not self.inflight:
                    self.collecting = False
                    self.awaiting_version = self.step
            elif self.served >= self.awaiting_version:
                await self._publish_tasks(self.cfg.tasks_per_step)
                self.collecting = True
        # Done once inference serves the final weights and the final evaluation is scored.
        if (
            min(self.trained, self.served) >= self.max_steps
            and self._final_evaluated()
            and not any(e.pending for e in self.evaluations.values())
        ):
            self.done.set()

    def _final_evaluated(self) -> bool:
        return not self.cfg.eval_every or self.max_steps in self.evaluations

    def _eval_after(self, version: int) -> int:
        """The next version on the eval_every grid after `version`, the final one at most."""
        every = self.cfg.eval_every or self.max_steps
        return min(self.max_steps, (version // every + 1) * every)

    async def _maybe_evaluate(self) -> None:
        if not self.cfg.eval_every or self.next_eval is None or self.served < self.next_eval:
            return
        version = self.served
        if version in self.evaluations:
            return
        self.next_eval = self._eval_after(version) if version < self.max_steps else None
        tasks = self.tasks.eval_set(version, self.cfg.eval_tasks, self.cfg.eval_group_size)
        self.evaluations[version] = HeldOutEval(version, {group_id_of(t) for t in tasks})
        await self.bus.publish_many(tasks)

    async def _publish_tasks(self, n: int) -> None:
        tasks: list[TaskPublished] = [self.tasks.next_train() for _ in range(max(0, n))]
        if tasks:
            self.inflight.update(group_id_of(t) for t in tasks)
            await self.bus.publish_many(tasks)

    async def _publish_batch(self, groups: int) -> bool:
        """Batch the `groups` ready groups sampled longest ago; False when none of their samples
        is fresh enough (they are dropped, counted, and nothing is published)."""
        assert self.step is not None
        taken, self.ready = take_oldest(self.ready, groups)
        fresh = filter_stale(
            [s for g in taken for s in g.samples], self.step, self.cfg.max_off_policy_steps
        )
        self.counts.dropped_stale += fresh.dropped
        taken_ids = [r for g in taken for r in g.rollout_ids]
        if not fresh.kept:
            self._release(taken_ids)
            return False  # never an empty batch: the trainer would step on nothing
        self.counts.samples += len(fresh.kept)
        self.step += 1
        versions = [s.policy_version for s in fresh.kept] or [self.step - 1]
        since = {k: float(v - getattr(self.counted, k)) for k, v in vars(self.counts).items()}
        self.counted = Counts(**vars(self.counts))
        rewards = [r for g in taken for r in g.rewards]
        batch_id = derived_id(self.run_id, "batch", self.step)
        batch = TrainBatch(
            event_id=batch_id,
            run_id=self.run_id,
            batch_id=batch_id,
            step=self.step,
            samples=fresh.kept,
            # The registry's names (what run configs say), of the groups in this batch.
            algorithm="+".join(sorted({self.algorithms[g.env].cfg.name for g in taken})),
            num_tokens=sum(len(tokens(s.input_ids)) for s in fresh.kept),
            min_policy_version=min(versions),
            max_policy_version=max(versions),
            dropped_stale=fresh.dropped,
            metrics={
                **since,
                "batch_groups": float(len(taken)),
                "mean_reward": float(np.mean(rewards)) if rewards else 0.0,
            },
        )
        # The batch continues its first rollout's trace and links to every rollout's score.
        scores = (d.headers for r in taken_ids for d in self.held.get(r, ()) if d.topic == "scored")
        attributes = {"rlbus.batch_id": batch_id, "rlbus.step": self.step}
        with telemetry.span(
            f"batch {self.step}",
            SpanKind.PRODUCER,
            attributes=attributes,
            **telemetry.joining(scores),
        ):
            await self.bus.publish(batch)
        # Acknowledged by the broker: the batch is the record now, its inputs may be committed.
        self.batched.update(taken_ids)
        self._release(taken_ids)
        log.info(
            "batch %d: %d samples from %d groups (staleness %s; dropped so far: %s)",
            self.step,
            len(fresh.kept),
            len(taken),
            fresh.histogram,
            self.counts,
        )
        return True


async def run_orchestrator(
    bus: Bus, orchestrator: Orchestrator, stop: asyncio.Event
) -> Orchestrator:
    """Consume until the run is done (max_steps batches and the final evaluation) or `stop`."""
    consumer_stop = asyncio.Event()

    async def watch() -> None:
        done = asyncio.create_task(orchestrator.done.wait())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
        done.cancel()
        stopped.cancel()
        consumer_stop.set()

    watcher = asyncio.create_task(watch())
    try:
        orchestrator.resume(await read_back(bus, "batches", orchestrator.run_id))  # type: ignore[arg-type]
        group = group_of(GROUP, orchestrator.run_id)
        consume = bus.subscriber(*TOPICS, group=group, batch=True, run=orchestrator.run_id)
        consume = consume(orchestrator.handle)
        await consume.run(consumer_stop)
    finally:
        watcher.cancel()
        for algorithm in orchestrator.algorithms.values():
            if algorithm.ctx.teacher is not None:
                await algorithm.ctx.teacher.close()
    return orchestrator


def summary(o: Orchestrator) -> dict[str, object]:
    evals = {
        v: {
            "mean_reward": float(np.mean(e.rewards)) if e.rewards else 0.0,
            "pass_rate": e.pass_rate,
            "rollouts": len(e.rewards),
        }
        for v, e in sorted(o.evaluations.items())
    }
    return {"steps": o.step, "counts": vars(o.counts), "evaluations": evals}
