"""`rlbus replay sft` as a library call: samples read from the store, trained in this process,
and the training published as a run's is (a TrainBatch and a TrainStep per step, WeightVersions
of the model it started from and the one it wrote), under a run id of its own, so a replay is a
run in the store like any other: `reward_by_step` has no rows for it, but `train_steps`,
`batches`, `weight_versions`, `staleness`, `throughput`, `rlbus ui` and `rlbus report` do."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlbus.bus import Bus
from rlbus.bus.store import open_store
from rlbus.bus.store.reads.replay import LANDED, STEPS
from rlbus.config.runs import ReplayConfig
from rlbus.consumers.orchestrator.stored_samples import StoredSamples, stored_samples
from rlbus.consumers.trainer.batch_trainer import step_event
from rlbus.consumers.trainer.sft import train_sft
from rlbus.consumers.trainer.step import StepResult
from rlbus.discovery import local_broker
from rlbus.launch.local_sink import local_sink
from rlbus.schemas import TrainBatch, TrainSample, WeightVersion, derived_id, step_id
from rlbus.schemas.packed import tokens

ALGORITHM = "sft"


class ReplayRunError(RuntimeError):
    """A replay that cannot start or finish; the message says what to do."""


@dataclass
class Selection:
    where: str
    run_id: str | None = None
    """Only rollouts of this run."""
    version: str = ""
    """Scorer version whose scores `where` sees ('': each rollout's newest)."""


@dataclass
class ReplayResult:
    run_id: str
    stored: StoredSamples
    results: list[StepResult]


def replay_run_id(cfg: ReplayConfig) -> str:
    """The replay's own run: the configured run_id, or a new one per replay."""
    return cfg.run_id if cfg.run_id != "default" else f"replay-sft-{time.strftime('%Y%m%d-%H%M%S')}"


def read_samples(cfg: ReplayConfig, selection: Selection) -> StoredSamples:
    with open_store(cfg.store.url, read_only=True) as store:
        return asyncio.run(
            stored_samples(store, selection.where, selection.run_id, selection.version)
        )


def _batch(run_id: str, step: int, samples: list[TrainSample]) -> TrainBatch:
    versions = [s.policy_version for s in samples]
    batch_id = step_id(run_id, "batch", step)
    return TrainBatch(
        event_id=batch_id,
        run_id=run_id,
        batch_id=batch_id,
        step=step,
        samples=samples,
        algorithm=ALGORITHM,
        num_tokens=sum(len(tokens(s.input_ids)) for s in samples),
        min_policy_version=min(versions),
        max_policy_version=max(versions),
    )


def _version(run_id: str, version: int, uri: Path) -> WeightVersion:
    return WeightVersion(
        event_id=derived_id(run_id, "weight-version", version),
        run_id=run_id,
        version=version,
        step=version,
        uri=str(uri),
    )


async def _train(
    cfg: ReplayConfig,
    run_id: str,
    samples: list[TrainSample],
    model: Path,
    out: Path,
    on_step: Callable[[int, StepResult], None] | None,
) -> list[StepResult]:
    loop = asyncio.get_running_loop()
    async with Bus.of(cfg) as bus:
        await bus.publish(_version(run_id, 0, model))

        def publish_step(step: int, batch: list[TrainSample], result: StepResult) -> None:
            event = _batch(run_id, step + 1, batch)
            events = [event, step_event(run_id, step + 1, event, result, 0, {})]
            asyncio.run_coroutine_threadsafe(bus.publish_many(events), loop).result()
            if on_step is not None:
                on_step(step, result)

        results = await asyncio.to_thread(
            train_sft,
            samples,
            model,
            out,
            cfg.trainer,
            cfg.steps,
            cfg.batch_size,
            cfg.seed,
            on_step=publish_step,
        )
        await bus.publish(_version(run_id, cfg.steps, out))
    return results


def replay_sft(
    cfg: ReplayConfig,
    selection: Selection,
    model: Path,
    out: Path,
    stored: StoredSamples | None = None,
    on_step: Callable[[int, StepResult], None] | None = None,
    store_timeout_s: float = 120,
) -> ReplayResult:
    """Train on the selected rollouts' samples (`stored`, read here when None) and return once
    every step and the model it wrote are in the store."""
    stored = stored or read_samples(cfg, selection)
    run_id = replay_run_id(cfg)
    with local_broker(cfg) as (live, _), local_sink(live) as sink:
        if before := sink.count(STEPS, {"run": run_id}):
            raise ReplayRunError(
                f"run {run_id!r} already has {before:,} train steps in {live.store.url}; "
                "pass another --run-id"
            )
        results = asyncio.run(_train(live, run_id, stored.samples, model, out, on_step))
        sink.wait_landed(
            LANDED,
            {"run": run_id},
            cfg.steps + 2,
            f"{cfg.steps} train steps and 2 weight versions of run {run_id} in the store",
            store_timeout_s,
        )
    return ReplayResult(run_id, stored, results)
