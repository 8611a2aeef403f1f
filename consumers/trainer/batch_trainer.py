"""The trainer's work (its door: consumers/trainer/role.py): consume `batches`, train one
optimizer step per TrainBatch, write weights + checkpoint, publish WeightVersion and TrainStep.

Exactly-once training on an at-least-once bus: the trainer state (with the ids of every batch
trained) is saved every `checkpoint_every` steps, and a batch's offset stays held (uncommitted)
until a saved state holds it. A crash thus redelivers every batch the last state does not hold
(trained again from that state) and perhaps some it holds (skipped, its WeightVersion
re-announced under the same event id). Weights are published every step.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry.trace import SpanKind

from rlbus.bus import Bus, Delivery, telemetry
from rlbus.bus.heap import release_free_heap
from rlbus.bus.unsent import Unsent
from rlbus.consumers.heartbeat import keep_announcing
from rlbus.consumers.trainer.checkpoint import CheckpointStore, TrainerState, WrittenWeights
from rlbus.consumers.trainer.step import StepResult
from rlbus.schemas import (
    TrainBatch,
    TrainSample,
    TrainStep,
    WeightVersion,
    derived_id,
    group_of,
    step_id,
)
from rlbus.schemas.staleness import filter_stale

log = logging.getLogger(__name__)

GROUP = "trainer"

Step = Callable[[Sequence[TrainSample], int], StepResult]
"""One optimizer step over samples at a version: `Trainer.step`, or FSDP's `Leader.step`."""


@dataclass
class Hooks:
    """How state leaves the trainer: one process reads its own model; FSDP gathers first."""

    weights: Callable[[], dict]
    """What a version publishes (CheckpointStore.weights_kind): full weights under the base
    model's names, or LoRA deltas."""
    state: Callable[[], dict]
    """Everything a resume needs (model incl. adapters, optimizer, scheduler)."""
    num_params: int


class BatchTrainer:
    def __init__(
        self,
        bus: Bus,
        step: Step,
        checkpoints: CheckpointStore,
        state: TrainerState,
        hooks: Hooks,
        run_id: str,
        max_off_policy_steps: int,
        max_steps: int,
        stop: asyncio.Event,
        checkpoint_every: int = 1,
        incarnation: str = "",
    ):
        """`incarnation`: "" for a trainer that started the run; a resumed trainer's own (e.g. a
        uuid): the steps it trains again after the state it resumed from are new records."""
        self.bus = bus
        self.step = step
        self.checkpoints = checkpoints
        self.state = state
        self.hooks = hooks
        self.run_id = run_id
        self.max_off_policy_steps = max_off_policy_steps
        self.max_steps = max_steps
        self.stop = stop
        self.checkpoint_every = checkpoint_every
        self.incarnation = incarnation
        self.saved_step = state.step
        """The step of the newest saved state."""
        self.unsaved: list[Delivery] = []
        """Batches trained since that state, held uncommitted until the next one is saved."""
        self.trained = set(state.batch_ids)
        self.skipped: Counter[str] = Counter()
        """Steps that left the weights as they were, by reason (StepResult.skipped)."""
        self.last: StepResult | None = None
        self.unsent: Unsent[TrainStep] = Unsent()
        """Steps trained whose record the broker did not take, by batch id."""
        self.announced: WeightVersion | None = None
        """The newest version published, re-published while the trainer runs (keep_announcing)."""

    def weight_version(self) -> WeightVersion:
        version = self.state.step
        return WeightVersion(
            event_id=derived_id(self.run_id, "weight-version", version),
            run_id=self.run_id,
            version=version,
            step=version,
            uri=self.checkpoints.weights_uri(version),
            format=self.checkpoints.weights_format,
            num_params=self.hooks.num_params,
        )

    async def announce(self) -> None:
        """Publish the current version (written first if missing): inference loads it on a
        resume, the orchestrator learns where the run stands."""
        if not self.checkpoints.has_weights(self.state.step):
            await asyncio.to_thread(
                self.checkpoints.write_weights, self.state.step, self.hooks.weights()
            )
        await self._announce()

    async def _announce(self, *with_it: TrainStep) -> None:
        version = self.weight_version()
        await self.bus.publish_many([version, *with_it])
        self.announced = version

    async def handle(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            batch = delivery.event
            if not isinstance(batch, TrainBatch):
                continue
            if batch.batch_id in self.trained:
                await self._trained_already(batch)
                continue
            # Batches past max_steps are left alone; everything else polled is trained, even
            # after a stop request, because its offset is committed when this returns.
            if self.state.step >= self.max_steps:
                continue
            # The step continues the batch's trace (and so its first rollout's).
            parent = telemetry.extract_context(delivery.headers) if telemetry.enabled() else None
            attributes = {"rlbus.batch_id": batch.batch_id, "rlbus.step": batch.step}
            with telemetry.span(f"train step {batch.step}", SpanKind.CONSUMER, parent, attributes):
                await self.train(batch, delivery)

    async def _trained_already(self, batch: TrainBatch) -> None:
        """A batch trained before (redelivered, or handled again by the subscriber after the
        broker did not take its step's record): the version is announced again, with that
        record if it was not taken."""
        log.info("batch %s (step %d) was trained already; skipped", batch.batch_id, batch.step)
        step = self.unsent.take(batch.batch_id)
        with self.unsent.kept_if_refused({batch.batch_id: step} if step else {}):
            await self._announce(*([step] if step else []))
        if self.state.step >= self.max_steps:
            self.stop.set()

    async def save_state(self) -> None:
        """Save the trainer state if steps were trained since the last, then let the bus commit
        past the batches it holds."""
        if self.state.step != self.saved_step:
            await asyncio.to_thread(self.checkpoints.save, self.state, self.hooks.state())
            self.saved_step = self.state.step
        for delivery in self.unsaved:
            delivery.release()
        self.unsaved.clear()

    async def train(self, batch: TrainBatch, delivery: Delivery) -> None:
        fresh = filter_stale(batch.samples, self.state.step, self.max_off_policy_steps)
        if fresh.dropped:
            log.warning(
                "batch %s: %d of %d samples are more than %d versions behind %d; dropped",
                batch.batch_id,
                fresh.dropped,
                len(batch.samples),
                self.max_off_policy_steps,
                self.state.step,
            )
        result = await asyncio.to_thread(self.step, fresh.kept, self.state.step)
        self.state.step += 1
        self.state.batch_ids.append(batch.batch_id)
        self.trained.add(batch.batch_id)
        delivery.hold()
        self.unsaved.append(delivery)
        written = await asyncio.to_thread(
            self.checkpoints.write_weights, self.state.step, self.hooks.weights()
        )
        # What the step freed, returned: glibc would keep it (over a GB on the tiny model,
        # bus/heap.py), for 0.1-0.4 s a step on 2 loaded cores.
        await asyncio.to_thread(release_free_heap)
        log.info(
            "weights version %d: %.1f MB written in %.2fs",
            self.state.step,
            written.bytes / 1e6,
            written.seconds,
        )
        if self.state.step % self.checkpoint_every == 0 or self.state.step >= self.max_steps:
            await self.save_state()
        self.last = result
        step = step_event(
            self.run_id,
            self.state.step,
            batch,
            result,
            batch.dropped_stale + fresh.dropped,
            fresh.histogram,
            written,
            self.incarnation,
        )
        if result.skipped:
            self.skipped[result.skipped] += 1
            log.warning(
                "step %d: weights left as they were (%s); %s so far",
                self.state.step,
                result.skipped,
                dict(self.skipped),
            )
        log.info("%s", step_line(self.state.step, result))
        with self.unsent.kept_if_refused({batch.batch_id: step}):
            await self._announce(step)
        if self.state.step >= self.max_steps:
            self.stop.set()


def step_line(step: int, r: StepResult) -> str:
    """The trainer's line for a step. Its KL is the inference/trainer mismatch on samples of
    the version being trained; a batch of older samples only has none, and says so."""
    if math.isfinite(r.mismatch_kl):
        kl = f"{r.mismatch_kl:.2e}"
    elif "off_policy_kl" in r.metrics:
        kl = f"- (no sample of this version; off-policy {r.metrics['off_policy_kl']:.2e})"
    else:  # a skipped step
        kl = "-"
    return (
        f"step {step}: loss {r.loss:.4f} grad norm {r.grad_norm:.3f} kl {kl} "
        f"({r.num_samples} samples, {r.seconds:.2f}s)"
    )


def step_event(
    run_id: str,
    step: int,
    batch: TrainBatch,
    r: StepResult,
    dropped: int,
    histogram: dict[str, int],
    written: WrittenWeights | None = None,
    incarnation: str = "",
) -> TrainStep:
    """What a train step publishes (the trainer's, and `rlbus replay sft`'s): `step` is the
    weights version it wrote (`written`: its size and write time, when one was written). A
    resumed trainer's `incarnation` is in the id: a step trained again is another attempt, with
    timings of its own, never the first attempt's id with another content."""
    return TrainStep(
        event_id=step_id(run_id, "train-step", step, incarnation),
        run_id=run_id,
        step=step,
        loss=r.loss,
        grad_norm=r.grad_norm,
        entropy=r.entropy,
        lr=r.lr,
        mismatch_kl=r.mismatch_kl,
        num_samples=r.num_samples,
        num_tokens=r.input_tokens,
        tokens_per_s=r.input_tokens / r.seconds if r.seconds else 0.0,
        dropped_stale=dropped,
        staleness=histogram,
        metrics={
            **r.metrics,
            **({f"skipped: {r.skipped}": 1.0} if r.skipped else {}),
            "loss_tokens": float(r.num_tokens),
            "step_s": r.seconds,
            "batch_step": float(batch.step),
            **(
                {"weights_mb": written.bytes / 1e6, "weights_write_s": written.seconds}
                if written
                else {}
            ),
        },
    )


async def train_batches(bus: Bus, worker: BatchTrainer) -> BatchTrainer:
    """Announce the current weights, then train until max_steps or `worker.stop`."""
    await worker.announce()
    if worker.state.step >= worker.max_steps:
        log.info(
            "step %d already reached max_steps %d; nothing to train",
            worker.state.step,
            worker.max_steps,
        )
        return worker
    every_s = bus.kafka.announce_every_s
    announcing = asyncio.create_task(
        keep_announcing(bus, lambda: worker.announced, every_s, worker.stop)
    )
    try:
        group = group_of(GROUP, worker.run_id)
        consume = bus.subscriber("batches", group=group, batch=True, run=worker.run_id)
        await consume(worker.handle).run(worker.stop)
    finally:
        announcing.cancel()
    # A clean stop keeps what was trained since the last state: its batches, still uncommitted,
    # come back on the next start and are skipped as trained.
    await worker.save_state()
    return worker
