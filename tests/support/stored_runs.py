"""Runs as a store holds them, written straight into it (no broker, no roles): what the ui's and
the report's tests read."""

from __future__ import annotations

from rlbus.bus.store import open_store
from rlbus.schemas import (
    Event,
    HealthSample,
    RolloutCompleted,
    RolloutScored,
    RunIncident,
    TokenRecord,
    TrainBatch,
    TrainStep,
    WeightLoaded,
    WeightVersion,
    derived_id,
)
from rlbus.schemas.packed import pack_tokens


def run_events(run: str, train: bool) -> list[list]:
    """Rollouts sampled by versions 0-2 (every fourth held out), their scores and timed model
    calls; with `train`, two train steps, their batches and their weights, published and loaded."""
    rollouts, scores, records = [], [], []
    for version in range(3):
        for i in range(4):
            rollout = derived_id(run, version, i)
            held_out = i == 3
            common = {
                "run_id": run,
                "rollout_id": rollout,
                "group_id": derived_id(run, version),
                "task_id": f"t{version}-{i}",
                "env": "reverse_text",
                "sample_index": i,
                "group_size": 4,
            }
            rollouts.append(
                RolloutCompleted(
                    **common,
                    info={"split": "test"} if held_out else {},
                    min_policy_version=version,
                    max_policy_version=version,
                    duration_s=0.5,
                )
            )
            scores.append(
                RolloutScored(**common, reward=version / 2 + i / 10, policy_version=version)
            )
            records.append(
                TokenRecord(
                    run_id=run,
                    rollout_id=rollout,
                    completion_ids=pack_tokens([1, 2, 3, 4]),
                    policy_version=version,
                    duration_s=0.25,
                    ts=1.7e9 + version * 10 + i,
                )
            )
    events = [rollouts, scores, records]
    if train:
        events.append(
            [
                TrainStep(
                    run_id=run,
                    step=step,
                    loss=1.0 / step,
                    num_samples=8,
                    num_tokens=256,
                    tokens_per_s=1000.0,
                    staleness={"0": 6, "1": 2},
                    dropped_stale=step - 1,
                    metrics={"step_s": 0.256, "weights_write_s": 0.05, "weights_mb": 5.0},
                )
                for step in (1, 2)
            ]
        )
        events.append(
            [
                WeightVersion(run_id=run, ts=1.7e9 + step, version=step, uri=f"v{step}")
                for step in (1, 2)
            ]
        )
        events.append(
            [
                WeightLoaded(
                    run_id=run, ts=1.7e9 + step + 0.1, version=step, worker_id="w", load_s=0.05
                )
                for step in (1, 2)
            ]
        )
        events.append(
            [
                TrainBatch(
                    run_id=run,
                    batch_id=derived_id(run, "batch", step),
                    step=step,
                    metrics={"dropped_zero_signal": 2.0, "dropped_too_long": 0.0},
                )
                for step in (1, 2)
            ]
        )
    return events


ROTATION = "rss 812 MB > 768 MB; 1,204 messages carried; paused 14.2 s"


def health_events(run: str) -> list[list]:
    """What `rlbus run` records of a run over two minutes: a sample every 15 s (memory growing,
    the judge falling behind), and a broker rotation."""
    samples = [
        HealthSample(
            run_id=run,
            ts=1.7e9 + 15 * i,
            rss_mib={"sink": 300.0 + i, "trainer": 900.5, "broker": 64.0 + 8 * i},
            lag={"sink": i % 3, f"judge.{run}.reverse_text": 10 * i},
        )
        for i in range(9)
    ]
    rotation = RunIncident(run_id=run, ts=1.7e9 + 61, incident="broker-rotation", detail=ROTATION)
    return [samples, [rotation]]


def store_events(url: str, batches: list[list[Event]]) -> None:
    """Each list of events inserted as one block, at offsets of its own."""
    with open_store(url) as store:
        for n, events in enumerate(batches):
            store.insert_events(events, [(0, 1000 * n + i) for i in range(len(events))], str(n))
