"""The orchestrator's work: scored rollouts in, TrainBatches and tasks out (its door:
consumers/orchestrator/role.py).

One consumer (one group join) reads trace-nodes, tokens, rollouts, scored and weights. Steps
are counted by the trainer's versions: batch s is trained on version s-1, so a sample's
staleness is known when its batch is packed, and the trainer's newest WeightVersion (published
on start, resumed or not, and read back from the topic by an orchestrator that starts later)
tells where the run stands. A version counts as served once
enough of the run's live inference replicas serve it (inference.served_by; their announcements
are followed outside the group, bus.announcements, since their repeats tell who is alive).

One orchestrator leads a run (bus.leadership); others started for it wait as standbys, and one
takes over, from what the bus holds, when the leader is gone.

The Orchestrator wires the parts, each readable alone: join.py (a rollout's pieces into groups),
holds.py (their deliveries kept uncommitted until batched), algorithms.py (a group into
samples, by the environment's algorithm), held_out.py (evaluations), staleness_gate.py (what a
batch takes) and pacing.py (when to batch and how many tasks to publish, by mode).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import msgspec
import numpy as np
from aiokafka.errors import KafkaError
from opentelemetry.trace import SpanKind

from rlbus.bus import Bus, Delivery, telemetry
from rlbus.bus.announcements import follow_announcements
from rlbus.bus.leadership import Leadership
from rlbus.bus.topic_reader import events_back
from rlbus.bus.unsent import Outbox
from rlbus.clients.replicas import Roster, StartingReplicas
from rlbus.config.orchestrator import OrchestratorConfig
from rlbus.consumers.orchestrator.algorithms import teacher_kl
from rlbus.consumers.orchestrator.held_out import HeldOut, HeldOutEval
from rlbus.consumers.orchestrator.holds import HeldRollouts
from rlbus.consumers.orchestrator.join import Group, Joiner
from rlbus.consumers.orchestrator.pacing import Pacing, Progress, pacing_for
from rlbus.consumers.orchestrator.staleness_gate import ReadyGroup, StalenessGate, take_oldest
from rlbus.consumers.orchestrator.task_draw import TaskSource
from rlbus.environment.algorithm import Algorithm
from rlbus.environment.judges import JUDGE_BRANCH
from rlbus.schemas import (
    TaskPublished,
    TraceNode,
    TrainBatch,
    TrainSample,
    WeightLoaded,
    WeightVersion,
    group_id_of,
    group_of,
    step_id,
)
from rlbus.schemas.packed import logprobs, mask, tokens

log = logging.getLogger(__name__)

WAITING_SAID_EVERY_S = 60.0
"""How often a run whose inference does not serve the trainer's version yet says so."""

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
        pacing: Pacing | None = None,
        roster: Roster | None = None,
        served_by: int = 0,
        starting: StartingReplicas | None = None,
    ):
        """`pacing`: None for the one cfg.mode names. `roster`: the run's inference replicas
        (fed by `handle` and, with their repeats, by bus.announcements); a version is served
        once `served_by` live replicas serve it (0: every live one). `starting`: the replicas
        the first tasks wait for (default: one)."""
        self.bus = bus
        self.cfg = cfg
        self.run_id = run_id
        self.max_steps = max_steps
        self.tasks = tasks
        self.algorithms = algorithms
        self.joiner = joiner
        self.pacing = pacing or pacing_for(cfg, max_steps)
        self.holds = HeldRollouts(cfg.max_off_policy_steps)
        self.held_out = HeldOut(cfg, max_steps, tasks)
        self.gate = StalenessGate(cfg.max_off_policy_steps)
        self.step: int | None = None
        """Batches published so far; None until the trainer has announced its version."""
        self.roster = roster or Roster()
        self.served_by = served_by
        self.starting = starting or StartingReplicas()
        self.served = -1
        self._waiting_since: float | None = None
        """When tasks began to wait for inference to serve the trainer's version."""
        self._said_waiting = 0.0
        """The newest version enough live inference replicas serve (it never goes back)."""
        self.trained = -1
        """Newest version the trainer announced: the run is done when it reaches max_steps."""
        self.inflight: set[str] = set()
        self.ready: list[ReadyGroup] = []
        self.start_version = 0
        """The trainer's first announced version: no task goes out before inference serves it."""
        self.incarnation = ""
        """In this term's batch ids when it resumed a run (schemas.ids.step_id)."""
        self.counts = Counts()
        self.counted = Counts()
        """`counts` when the last batch went out: each batch reports what happened since."""
        self.done = asyncio.Event()
        self.may_publish: Callable[[], bool] = lambda: True
        """False while this process is not sure it leads the run (a rebalance of its
        leadership group): it then publishes no batch and no task."""
        self._turn = asyncio.Lock()
        """Handling events and the clock's ticks take turns."""
        self.outbox = Outbox()
        """Evaluations, batches and tasks built, until the broker takes them."""

    @property
    def held(self) -> dict[str, list[Delivery]]:
        return self.holds.held

    @property
    def evaluations(self) -> dict[int, HeldOutEval]:
        return self.held_out.evaluations

    async def resume(self) -> None:
        """Learn where the run stands from the bus: the batches earlier orchestrators of the run
        published, and the newest version the trainer announced (the group may have committed
        past it, and a trainer that finished the run announces nothing again)."""
        batches = (
            e
            async for e in events_back(self.bus, "batches", self.run_id)
            if isinstance(e, TrainBatch)
        )
        versions = [
            e.version
            async for e in events_back(self.bus, "weights", self.run_id)
            if isinstance(e, WeightVersion)
        ]
        await self.holds.resume(batches)
        if versions:
            self._on_version(max(versions))
        if self.holds.published_step:
            log.info(
                "batches of run %s were published before, up to step %d",
                self.run_id,
                self.holds.published_step,
            )

    # -- events ----------------------------------------------------------------------

    async def handle(self, deliveries: list[Delivery]) -> None:
        async with self._turn:
            await self._handle(deliveries)

    async def tick(self) -> None:
        """What time alone changes: replicas that went silent no longer hold a version back."""
        async with self._turn:
            await self.advance()

    def _count_served(self) -> None:
        served = self.roster.served(self.served_by)
        if served is None or served <= self.served:
            return
        # A new run's first tasks would all go to the replicas that came up first. (A resumed
        # run, or an orchestrator taking over, goes on with those live: the run is under way.)
        new_run = self.served < 0 and self.start_version == 0
        if new_run and not self.starting.all_up(self.roster, 0):
            return
        self.served = served

    async def _handle(self, deliveries: list[Delivery]) -> None:
        for d in deliveries:
            event = d.event
            if isinstance(event, WeightVersion):
                self._on_version(event.version)
            elif isinstance(event, WeightLoaded):
                self.roster.heard(event, d.record.timestamp / 1000 if d.record else time.time())
            elif isinstance(event, TraceNode) and event.branch_id == JUDGE_BRANCH:
                continue  # an LLM judge's call behind a score: not the policy's to train on
            # the kinds left on these topics are a rollout's parts, each naming its rollout
            elif self.holds.hold(event.rollout_id, d):  # type: ignore[attr-defined]
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
            self.holds.release(expired)
        await self.advance()

    def _on_version(self, version: int) -> None:
        self.trained = max(self.trained, version)
        if self.step is None:  # the trainer's announcement on start, fresh or resumed
            # A predecessor may have published batches the trainer has not trained yet.
            step = max(version, self.holds.published_step)
            self.step = self.start_version = step
            # A broker lost in a full stop took the batches past the trainer's saved state:
            # this term may build those steps again, from other samples.
            self.incarnation = self.tasks.term if step else ""
            self.held_out.start(step)
            self.tasks.skip(step * self.cfg.tasks_per_step)
            log.info("trainer is at version %d; next batch is step %d", version, step + 1)

    async def _on_group(self, group: Group) -> None:
        rollout_ids = [m.rollout.rollout_id for m in group.members]
        try:
            kept = await self._trainable(group)
        except BaseException:
            self.holds.release(rollout_ids)
            raise
        if kept:
            rewards = [m.scored.reward for m in group.members]
            self.ready.append(ReadyGroup(kept, rewards, rollout_ids, group.env))
        else:
            self.holds.release(rollout_ids)

    async def _trainable(self, group: Group) -> list[TrainSample]:
        """The group's samples to train on; none for a held-out group (its rewards go to its
        evaluation) or one dropped (counted)."""
        self.counts.errored_rollouts += sum(m.scored.status != "ok" for m in group.members)
        self.counts.untrainable += group.untrainable
        if self.held_out.record(group):
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
        pacer = self.pacing.pacer
        was_failing = pacer.failing
        pacer.observe(bool(kept), errored)
        if pacer.failing and not was_failing:
            log.warning(
                "most recent groups errored whole (%s); backing off to %d tasks in flight",
                group.members[0].scored.error[:200],
                pacer.max_inflight(),
            )
        return kept

    # -- evaluation, batching and task publication ---------------------------------------

    def _progress(self) -> Progress:
        assert self.step is not None
        return Progress(
            self.step, len(self.ready), len(self.inflight), self.served, self.start_version
        )

    async def advance(self) -> None:
        self._count_served()
        if self.step is None or not self.may_publish():
            return  # the trainer has not announced its version yet, or another may lead
        self._say_waiting()
        try:
            await self._publish()
        except KafkaError as exc:
            # Not the events' fault, so the handler is not run again on them: they are taken in
            # already, and joining their groups again would batch them twice. What was built
            # waits in the outbox for the next turn, a handler's or the clock's.
            log.warning(
                "the broker did not take the orchestrator's publications (%r); %d kept, "
                "sent again at its next turn",
                exc,
                len(self.outbox),
            )
            return
        # Done once inference serves the final weights and the final evaluation is scored.
        if min(self.trained, self.served) >= self.max_steps and self.held_out.finished():
            self.done.set()

    async def _publish(self) -> None:
        """What the broker refused before goes out first; nothing new is built until it did."""
        await self.outbox.send()
        evaluation = self.held_out.due(self.served)
        if evaluation:
            self.outbox.put(partial(self.bus.publish_many, evaluation))
        while (groups := self.pacing.may_batch(self._progress())) is not None:
            self.pacing.batched(self._build_batch(groups))
        self._draw_tasks(self.pacing.tasks_to_publish(self._progress()))
        await self.outbox.send()

    def _say_waiting(self) -> None:
        """While tasks wait for inference to serve the trainer's version (at the start, and
        the version resumed from), say so every WAITING_SAID_EVERY_S: a replica that cannot
        load it is no silent stall."""
        if self.served >= self.start_version:
            self._waiting_since = None
            return
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = self._said_waiting = now
        elif now - self._said_waiting >= WAITING_SAID_EVERY_S:
            self._said_waiting = now
            log.warning(
                "no task sent for %.0fs: waiting for inference to serve version %d, the "
                "trainer's (%d of %d replicas serve it); a replica that cannot load it says why "
                "in its log",
                now - self._waiting_since,
                self.start_version,
                self.roster.serving(self.start_version),
                max(self.starting.expected, len(self.roster.live())),
            )

    def _draw_tasks(self, n: int) -> None:
        # Sampled with what enough replicas serve: env producers pass over replicas behind it.
        at_least = max(self.served, 0)
        tasks: list[TaskPublished] = [
            msgspec.structs.replace(self.tasks.next_train(), min_policy_version=at_least)
            for _ in range(max(0, n))
        ]
        if tasks:
            self.inflight.update(group_id_of(t) for t in tasks)
            self.outbox.put(partial(self.bus.publish_many, tasks))

    def _build_batch(self, groups: int) -> bool:
        """Batch the `groups` ready groups sampled longest ago, to be sent; False when none of
        their samples is fresh enough (they are dropped, counted, and no batch is built)."""
        assert self.step is not None
        taken, self.ready = take_oldest(self.ready, groups)
        fresh = self.gate.fresh(taken, self.step)
        self.counts.dropped_stale += fresh.dropped
        taken_ids = [r for g in taken for r in g.rollout_ids]
        if not fresh.kept:
            self.holds.release(taken_ids)
            return False  # never an empty batch: the trainer would step on nothing
        self.counts.samples += len(fresh.kept)
        self.step += 1
        versions = [s.policy_version for s in fresh.kept] or [self.step - 1]
        since = {k: float(v - getattr(self.counted, k)) for k, v in vars(self.counts).items()}
        self.counted = Counts(**vars(self.counts))
        rewards = [r for g in taken for r in g.rewards]
        env_of = {r: g.env for g in taken for r in g.rollout_ids}
        batch_id = step_id(self.run_id, "batch", self.step, self.incarnation)
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
                **teacher_kl([(s, env_of.get(s.rollout_id, "")) for s in fresh.kept]),
            },
        )
        log.info(
            "batch %d: %d samples from %d groups (staleness %s; dropped so far: %s)",
            self.step,
            len(fresh.kept),
            len(taken),
            fresh.histogram,
            self.counts,
        )
        self.outbox.put(partial(self._send_batch, batch, taken_ids))
        return True

    async def _send_batch(self, batch: TrainBatch, taken_ids: list[str]) -> None:
        # The batch continues its first rollout's trace and links to every rollout's score.
        scores = self.holds.headers(taken_ids, "scored")
        attributes = {"rlbus.batch_id": batch.batch_id, "rlbus.step": batch.step}
        with telemetry.span(
            f"batch {batch.step}",
            SpanKind.PRODUCER,
            attributes=attributes,
            **telemetry.joining(scores),
        ):
            await self.bus.publish(batch)
        # Acknowledged by the broker: the batch is the record now, its inputs may be committed.
        self.holds.mark_batched(taken_ids, batch.step)


async def run_orchestrator(
    bus: Bus,
    orchestrator: Orchestrator,
    stop: asyncio.Event,
    leadership: Leadership | None = None,
    tick_s: float = 1.0,
) -> Orchestrator:
    """Consume until the run is done (max_steps batches and the final evaluation), `stop`, or
    `leadership` is lost to another process. Meanwhile follow the inference replicas'
    announcements and let the clock tick every `tick_s`."""
    consumer_stop = asyncio.Event()
    if leadership is not None:
        orchestrator.may_publish = lambda: leadership.leading
    ends = [orchestrator.done, stop, *([leadership.lost] if leadership else [])]

    async def watch() -> None:
        waits = [asyncio.create_task(e.wait()) for e in ends]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        consumer_stop.set()

    async def ticking() -> None:
        try:
            while not consumer_stop.is_set():
                await asyncio.sleep(tick_s)
                await orchestrator.tick()
        finally:
            consumer_stop.set()  # a tick that failed stops the orchestrator, as a handler would

    run_id = orchestrator.run_id
    helpers = [
        asyncio.create_task(watch()),
        asyncio.create_task(ticking()),
        asyncio.create_task(
            follow_announcements(bus, run_id, orchestrator.roster.heard, consumer_stop)
        ),
    ]
    try:
        await orchestrator.resume()
        group = group_of(GROUP, run_id)
        consume = bus.subscriber(*TOPICS, group=group, batch=True, run=run_id)
        consume = consume(orchestrator.handle)
        await consume.run(consumer_stop)
        ticker = helpers[1]
        if ticker.done() and not ticker.cancelled() and ticker.exception() is not None:
            raise ticker.exception()  # type: ignore[misc]  # just checked: an exception
    finally:
        consumer_stop.set()
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        for algorithm in orchestrator.algorithms.values():
            if algorithm.ctx.teacher is not None:
                await algorithm.ctx.teacher.close()
    return orchestrator


def summary(o: Orchestrator) -> dict[str, object]:
    return {"steps": o.step, "counts": vars(o.counts), "evaluations": o.held_out.summary()}
