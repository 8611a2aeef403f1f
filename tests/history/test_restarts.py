"""Each role's restart is exact (issue 14, findings 5 and 6): an orchestrator that stops with
groups joined but not yet batched finds them again, and never batches a group twice."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest
from support.factories import scored_group

from rlbus.bus import Bus, Delivery
from rlbus.config import Settings, load_settings
from rlbus.config.runs import RunConfig
from rlbus.consumers.orchestrator.build import build_orchestrator
from rlbus.consumers.orchestrator.orchestration import run_orchestrator
from rlbus.schemas import (
    Event,
    RolloutCompleted,
    RolloutScored,
    TrainBatch,
    WeightLoaded,
    WeightVersion,
    derived_id,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"
SIZE = 2


def run_config(settings: Settings) -> RunConfig:
    data = settings.model_dump(mode="json", exclude_none=True)
    return load_settings(
        overrides={
            **data,
            "model": "unused (grpo needs no tokenizer)",
            "max_steps": 50,
            "orchestrator": {
                "tasks_per_step": 4,
                "max_inflight_tasks": 1,
                "max_off_policy_steps": 100,
                "drop_zero_signal": False,
            },
            "envs": {
                "reverse_text": {
                    "path": str(EXAMPLE / "env.toml"),
                    "overrides": {"group_size": SIZE},
                }
            },
        },
        model=RunConfig,
    )


def group(run_id: str, name: str) -> list[Event]:
    """A scored group of SIZE rollouts with whole traces, as env producers and judges publish."""
    members = range(SIZE)
    return scored_group(
        run_id,
        derived_id("group", name),
        name,
        [[4, 5] for _ in members],
        [float(i) for i in members],
        info={"split": "train"},
    )


async def orchestrating(cfg: RunConfig, stop: asyncio.Event):
    async with Bus.of(cfg) as bus:
        orchestrator = build_orchestrator(bus, cfg, EXAMPLE)
        await run_orchestrator(bus, orchestrator, stop)
    return orchestrator


async def batches_of(cfg: RunConfig, n: int) -> list[TrainBatch]:
    got: list[TrainBatch] = []
    done = asyncio.Event()

    async def collect(deliveries: list[Delivery]) -> None:
        got.extend(d.event for d in deliveries if isinstance(d.event, TrainBatch))
        if len(got) >= n:
            done.set()

    async with Bus.of(cfg) as bus:
        watch = bus.subscriber("batches", group=f"watch-{uuid.uuid4().hex}", batch=True)(collect)
        await asyncio.wait_for(watch.run(done), 120)
    return got


async def test_groups_joined_before_a_restart_are_batched_after_it_and_never_twice(
    settings: Settings,
) -> None:
    cfg = run_config(settings)
    run = cfg.run_id
    # The trainer and inference workers re-announce these every few seconds.
    announcements = [
        WeightVersion(version=0, uri="x", run_id=run),
        WeightLoaded(version=0, worker_id="w", run_id=run),
    ]
    async with Bus.of(cfg) as bus:
        await bus.publish_many(announcements)
        first_stop = asyncio.Event()
        first = asyncio.create_task(orchestrating(cfg, first_stop))
        for name in ["a", "b", "c", "d", "e", "f"]:  # one batch of four, two groups left over
            await bus.publish_many(group(run, name))
        (batch1,) = await batches_of(cfg, 1)
        await asyncio.sleep(2)  # the two left over are joined, waiting for two more
        first_stop.set()
        await first
        second_stop = asyncio.Event()
        second = asyncio.create_task(orchestrating(cfg, second_stop))
        await bus.publish_many(announcements)
        for name in ["g", "h"]:
            await bus.publish_many(group(run, name))
        batches = await batches_of(cfg, 2)
        second_stop.set()
        restarted = await second
    batch2 = next(b for b in batches if b.step == 2)
    in1 = {s.rollout_id for s in batch1.samples}
    in2 = {s.rollout_id for s in batch2.samples}
    assert len(in1) == len(in2) == 4 * SIZE and not in1 & in2  # eight groups, each trained once
    assert restarted.step == 2


async def test_a_restarted_inference_worker_serves_the_runs_weights_before_anything_else(
    settings: Settings, tmp_path: Path
) -> None:
    """The run is at version 3 when an inference worker (re)starts: until it has loaded version
    3 it answers 503, health included, and the first completion it serves is version 3's. On
    main it served its starting weights, labelled version 0, at once."""
    import httpx
    from safetensors.torch import save_file

    from rlbus.bus import free_port
    from rlbus.consumers.inference.model_init import init_model
    from rlbus.consumers.inference.service import build_app, build_backend
    from rlbus.consumers.inference.serving import serve_following_weights

    model = tmp_path / "tiny"
    init_model(model, seed=0)
    backend = build_backend(model)
    weights = tmp_path / "v3.safetensors"
    save_file({n: p.detach() * 1.5 for n, p in backend.model.named_parameters()}, str(weights))
    async with Bus.of(settings) as bus:
        await bus.publish(WeightVersion(version=3, step=3, uri=str(weights)))
    port = free_port()
    stop = asyncio.Event()
    worker = asyncio.create_task(
        serve_following_weights(
            settings, backend, build_app(backend, model), "127.0.0.1", port, stop
        )
    )
    seen: list[tuple[int, int | None]] = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            for _ in range(600):
                try:
                    health = await http.get("/health")
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
                    continue
                seen.append((health.status_code, health.json().get("policy_version")))
                if health.status_code == 200:
                    break
                await asyncio.sleep(0.05)
            body = {"prompt_ids": [1, 2, 3], "sampling": {"max_tokens": 2}}
            generated = (await http.post("/v1/generate", json=body)).json()
    finally:
        stop.set()
        await worker
    assert seen[-1] == (200, 3), seen
    assert all(code == 503 for code, _ in seen[:-1])
    assert generated["policy_version"] == 3


async def test_a_restarted_event_subscriber_runs_only_what_it_had_not_finished(
    settings: Settings,
) -> None:
    """One slow event keeps its partition's commit back while twenty quick ones after it finish
    (an env producer's long rollout): after a restart only the slow one runs again. On main the
    twenty ran again too, under the same output ids with new content."""

    async with Bus.of(settings) as bus:
        await bus.publish_many(
            [
                RolloutCompleted(rollout_id=str(i), group_id="g", task_id="t", env="e")
                for i in range(21)
            ]
        )  # one key: one partition, in order
        first: list[str] = []
        stop = asyncio.Event()

        async def stuck_on_three(d: Delivery) -> None:
            if d.event.rollout_id == "3":  # type: ignore[attr-defined]
                await asyncio.Event().wait()
            first.append(d.event.rollout_id)  # type: ignore[attr-defined]
            if len(first) == 20:
                stop.set()

        consume = bus.subscriber("rollouts", group="env", concurrency=4)(stuck_on_three)
        await asyncio.wait_for(consume.run(stop), 60)
        again: list[str] = []
        stop_again = asyncio.Event()

        async def record(d: Delivery) -> None:
            again.append(d.event.rollout_id)  # type: ignore[attr-defined]
            stop_again.set()

        restarted = bus.subscriber("rollouts", group="env", concurrency=4)(record)
        await asyncio.wait_for(restarted.run(stop_again), 60)
        await asyncio.sleep(1)  # anything else would have come by now
    assert sorted(first, key=int) == [str(i) for i in range(21) if i != 3]
    assert again == ["3"]


async def test_a_handler_stopped_while_publishing_is_let_finish_and_never_runs_again(
    settings: Settings,
) -> None:
    """A stop that comes while a handler waits for its outputs' acknowledgements lets it finish
    and commit: what it began to send goes out anyway (the producer flushes as it closes), so
    cancelling it there left its event uncommitted, and a restart ran it again under the same
    output ids with new content (32 conflicts in a broker handover run, CI of 896f71c)."""
    from rlbus.bus.topic_reader import read_records

    outputs = [
        RolloutScored(rollout_id=str(i), group_id="g", task_id="t", env="e", reward=1.0)
        for i in range(300)
    ]
    async with Bus.of(settings) as bus:
        await bus.publish(RolloutCompleted(rollout_id="in", group_id="g", task_id="t", env="e"))
        await bus.ensure_topics(["scored"])  # the stop comes as outputs are sent, not before
        runs = 0
        stop = asyncio.Event()

        async def publish_as_the_stop_comes(d: Delivery) -> None:
            nonlocal runs
            runs += 1
            stop.set()  # seen at the subscriber's next poll, 1 ms on: while this publishes
            await bus.publish_many(outputs)

        consume = bus.subscriber("rollouts", group="env", poll_timeout_ms=1)(
            publish_as_the_stop_comes
        )
        await asyncio.wait_for(consume.run(stop), 60)
        restarted_stop = asyncio.Event()
        asyncio.get_running_loop().call_later(3, restarted_stop.set)  # a redelivery comes by then
        restarted = bus.subscriber("rollouts", group="env")(publish_as_the_stop_comes)
        await asyncio.wait_for(restarted.run(restarted_stop), 60)
        published = await read_records(bus, "scored")
    assert (runs, len(published)) == (1, len(outputs))


async def test_a_resumed_orchestrator_says_it_waits_for_inference_to_serve_the_trainers_version(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resumed run sends no task until inference serves the trainer's version. When a replica
    cannot load it (a weights file pruned: 891b30f), the run waited for ever and said nothing;
    the orchestrator now says what it waits for, every minute while it lasts."""
    from rlbus.consumers.orchestrator import orchestration

    clock = [1000.0]
    monkeypatch.setattr(orchestration.time, "monotonic", lambda: clock[0])
    async with Bus.of(settings) as bus:
        o = build_orchestrator(bus, run_config(settings), EXAMPLE)
        o._on_version(40)  # the resumed trainer's announcement; no replica serves anything
        said = []
        for _ in range(4):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger=orchestration.__name__):
                await o.tick()
            said.append([r.getMessage() for r in caplog.records])
            clock[0] += 40
    assert said[0] == said[1] == said[3] == [], said
    assert said[2] == [
        "no task sent for 80s: waiting for inference to serve version 40, the trainer's (0 of "
        "1 replicas serve it); a replica that cannot load it says why in its log"
    ], said


async def test_a_run_resumed_on_a_broker_that_lost_its_batches_never_reuses_a_batch_id(
    settings: Settings,
) -> None:
    """A full stop of the embedded default loses the broker, and with it the batches the dead
    orchestrator published past the trainer's saved state (steps 41-47 in the long run of
    examples/reverse_text/RESULTS.md). The resumed orchestrator builds those steps again from
    other samples: under the dead one's ids they were 7 conflicts in the store."""
    cfg = run_config(settings)
    run = cfg.run_id
    announcements = [
        WeightVersion(version=40, uri="x", run_id=run),  # the trainer resumed from step 40
        WeightLoaded(version=40, worker_id="w", run_id=run),
    ]
    built: list[TrainBatch] = []
    for names in (["a", "b", "c", "d"], ["e", "f", "g", "h"]):
        # Each term on a broker of its own: the second knows nothing of the first's batches.
        term = cfg.model_copy(deep=True)
        term.kafka.topic_prefix = f"t{uuid.uuid4().hex[:8]}."
        stop = asyncio.Event()
        async with Bus.of(term) as bus:
            await bus.publish_many(announcements)
            running = asyncio.create_task(orchestrating(term, stop))
            for name in names:
                await bus.publish_many(group(run, name))
            built += await batches_of(term, 1)
            stop.set()
            await running
    first, again = built
    assert first.step == again.step == 41
    assert first.batch_id != again.batch_id, "step 41 built twice under one id"
