"""A cut-down learning run with fixed seeds: scripted-teacher rollouts through the pipeline,
SFT replayed from ClickHouse, then GRPO through the bus and store; held-out exact match after
RL must beat the SFT warm start's (the full recipe: bench/learning.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.in_process import run_in_process

from rlbus.bus.store import open_store
from rlbus.config import Settings, load_settings
from rlbus.config.runs import RunConfig
from rlbus.config.trainer import TrainerConfig
from rlbus.consumers.orchestrator.stored_samples import stored_samples
from rlbus.consumers.trainer.sft import train_sft
from rlbus.environment import load_environment
from rlbus.launch import recipe
from rlbus.launch.local_sink import local_sink

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"

STEPS = 60


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_grpo_raises_reward_after_sft_warm_start(settings: Settings, tmp_path: Path) -> None:
    init, sft = tmp_path / "init", tmp_path / "sft"
    recipe.init_terse_model(init, seed=0)
    teacher = settings.model_copy(update={"run_id": "teacher"})
    tasks = recipe.train_tasks(load_environment(recipe.TERSE_ENV), teacher.run_id, 512)
    with local_sink(teacher) as sink:
        scored = await recipe.collect_teacher(
            teacher, recipe.reverse_teacher, init, sink, 512, tasks
        )
    assert scored == 512
    with open_store(settings.store.url, read_only=True) as store:
        stored = await stored_samples(store, "reward >= 1 AND env = 'reverse_text'", "teacher")
    # A short warm start (held-out exact match ~0.3) leaves RL room to show a rise quickly.
    cfg = TrainerConfig.model_validate({"optim": {"lr": 3e-3, "warmup_steps": 10}, "threads": 1})
    await asyncio.to_thread(train_sft, stored.samples, init, sft, cfg, 90, 64)
    run = load_settings(
        EXAMPLE / "rl.toml",
        model=RunConfig,
        overrides={
            **settings.model_dump(mode="json", exclude_none=True),
            "run_id": "rl",
            "model": str(sft),
            "max_steps": STEPS,
            "orchestrator": {
                "tasks_per_step": 8,
                "eval_every": STEPS,
                "eval_tasks": 512,
                "seed": 0,
            },
            "trainer": {"checkpoint_url": str(tmp_path / "ckpt")},
        },
    )
    await run_in_process(run, EXAMPLE, timeout_s=420)
    with open_store(settings.store.url, read_only=True) as store:
        held_out = {version: exact for version, exact, _, _ in recipe.held_out(store, "rl")}
    print("held-out exact match by version:", held_out)
    assert set(held_out) == {0, STEPS}
    # 512 held-out tasks: the difference of two exact-match rates near 0.5 has a standard error
    # of ~0.03, and 60 steps rise ~0.2 here (0.13-0.17 after 40 steps, and once 0.08 on a loaded
    # CI machine), so +0.1 fails only when RL does not work.
    assert held_out[STEPS] > held_out[0] + 0.1
