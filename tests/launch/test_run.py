"""A whole RL run on a tiny model with every role on the real broker and a real chdb store:
inference (built-in engine following weights), env producer, judge, orchestrator, trainer and
sink, in this process's event loop (`rlbus run`'s subprocess launcher: test_run_cli.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.in_process import run_in_process
from support.runs import EXAMPLE, run_config

from rlbus.bus.store import open_store
from rlbus.config import Settings
from rlbus.config.runs import RunConfig
from rlbus.consumers.inference.model_init import init_model


async def run_all(cfg: RunConfig) -> dict:
    orch = await run_in_process(cfg, EXAMPLE, timeout_s=240)
    p = {"r": cfg.run_id}
    with open_store(cfg.store.url, read_only=True) as store:
        return {
            "orch": orch,
            "versions": [
                r[0]
                for r in store.query(
                    "SELECT version FROM weight_versions FINAL WHERE run_id = {r:String} ORDER BY "
                    "version",
                    p,
                ).rows
            ],
            "loaded": [
                r[0]
                for r in store.query(
                    "SELECT DISTINCT version FROM weights_loaded FINAL WHERE run_id = {r:String} "
                    "ORDER BY version",
                    p,
                ).rows
            ],
            "token_versions": [
                r[0]
                for r in store.query(
                    "SELECT DISTINCT policy_version FROM tokens FINAL WHERE run_id = {r:String} "
                    "ORDER BY 1",
                    p,
                ).rows
            ],
            "steps": store.query(
                "SELECT step, mismatch_kl, num_samples, dropped_stale, staleness FROM train_steps "
                "FINAL WHERE run_id = {r:String} ORDER BY step",
                p,
            ).rows,
            "batches": store.query(
                "SELECT step, dropped_stale, metrics['batch_groups'], metrics['mean_reward'], "
                "metrics['groups'] FROM batches FINAL WHERE run_id = {r:String} ORDER BY step",
                p,
            ).rows,
        }


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny"
    init_model(path, seed=0)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_run_versions_flow_through_inference_and_rollouts(
    settings: Settings, tiny: Path, tmp_path: Path, mode: str
) -> None:
    out = await run_all(run_config(settings, tiny, tmp_path, mode=mode, drop_zero_signal=False))
    assert out["versions"] == [0, 1, 2, 3, 4]
    assert {2, 4} <= set(out["loaded"])  # inference served new weights (and said so)
    assert max(out["token_versions"]) >= 1  # rollouts were sampled by trained versions
    steps = out["steps"]
    assert [s[0] for s in steps] == [1, 2, 3, 4]
    assert all(
        s[2] == 16 and s[3] == 0 for s in steps
    )  # full batches, nothing stale reached the trainer
    # Each batch says what it is made of: 4 groups of 4, their mean reward, groups seen since
    # the last.
    assert [b[:3] for b in out["batches"]] == [(step, 0, 4.0) for step in (1, 2, 3, 4)]
    assert all(0 <= b[3] <= 1 for b in out["batches"]) and sum(b[4] for b in out["batches"]) >= 16
    behind = [int(k) for s in steps for k in s[4]]
    print(
        f"{mode}: mismatch KL per step {[f'{s[1]:.2e}' for s in steps]}; staleness "
        f"{[dict(s[4]) for s in steps]}"
    )
    if mode == "sync":
        assert behind == [0, 0, 0, 0]
        assert all(s[1] < 1e-3 for s in steps)  # same fp32 weights in the engine and the trainer
    else:
        assert max(behind) <= 2
    evaluations = out["orch"].evaluations
    assert set(evaluations) == {0, 2, 4} and all(e.rollouts == 8 for e in evaluations.values())


@pytest.mark.slow
async def test_restarted_orchestrator_learns_where_the_run_stands(
    settings: Settings, tiny: Path, tmp_path: Path
) -> None:
    """Stop the orchestrator while the trainer and inference wait for its next batch (sync mode,
    after step 2): a new one has missed their announcements (committed by the first), and
    learns the trained and served versions from their re-announcements, then finishes the run."""
    from support.in_process import local_roles

    from rlbus.consumers.orchestrator.build import build_orchestrator
    from rlbus.consumers.orchestrator.orchestration import run_orchestrator

    cfg = run_config(settings, tiny, tmp_path, mode="sync", eval_every=0, drop_zero_signal=False)
    cfg = cfg.model_copy(update={"kafka": cfg.kafka.model_copy(update={"announce_every_s": 1.0})})
    async with local_roles(cfg, EXAMPLE) as (cfg, bus, store, _):
        first = build_orchestrator(bus, cfg, EXAMPLE)
        stop_first = asyncio.Event()
        running = asyncio.create_task(run_orchestrator(bus, first, stop_first))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 180
        while min(first.trained, first.served) < 2:
            assert not running.done() and loop.time() < deadline
            await asyncio.sleep(0.1)
        stop_first.set()
        await running
        second = build_orchestrator(bus, cfg, EXAMPLE)
        try:
            await asyncio.wait_for(run_orchestrator(bus, second, asyncio.Event()), 240)
        except TimeoutError:
            pytest.fail(
                f"the second orchestrator is stuck: step {second.step}, trained {second.trained}, "
                f"served "
                f"{second.served}, {len(second.inflight)} groups in flight, {len(second.ready)} "
                f"ready"
            )
    assert second.start_version >= 2 and second.trained == 4 and second.served == 4


@pytest.mark.slow
async def test_an_orchestrator_started_after_the_last_batch_finishes_the_run(
    settings: Settings, tiny: Path, tmp_path: Path
) -> None:
    """The standby's edge: every batch is out and the trainer has trained them all and exited
    before the next orchestrator starts. Its group committed past the trainer's last
    WeightVersion and nobody announces one again, so it learns the version from the topic's
    history, finishes at once, and publishes no batch twice."""
    from support.in_process import local_roles

    from rlbus.bus.topic_reader import read_back
    from rlbus.consumers.orchestrator.build import build_orchestrator
    from rlbus.consumers.orchestrator.orchestration import run_orchestrator
    from rlbus.schemas import TrainBatch

    cfg = run_config(settings, tiny, tmp_path, mode="sync", eval_every=0, drop_zero_signal=False)
    cfg = cfg.model_copy(update={"kafka": cfg.kafka.model_copy(update={"announce_every_s": 1.0})})
    async with local_roles(cfg, EXAMPLE) as (cfg, bus, store, _):
        first = build_orchestrator(bus, cfg, EXAMPLE)
        await asyncio.wait_for(run_orchestrator(bus, first, asyncio.Event()), 240)
        assert first.trained == 4
        second = build_orchestrator(bus, cfg, EXAMPLE)
        try:
            await asyncio.wait_for(run_orchestrator(bus, second, asyncio.Event()), 60)
        except TimeoutError:
            pytest.fail(
                f"stuck: step {second.step}, trained {second.trained}, served {second.served}"
            )
        batches = [
            e for e in await read_back(bus, "batches", cfg.run_id) if isinstance(e, TrainBatch)
        ]
    assert second.trained == 4 and second.step == 4
    assert sorted(b.step for b in batches) == [1, 2, 3, 4]
