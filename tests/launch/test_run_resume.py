"""Trainer crash and resume, as real processes: SIGKILL the trainer mid-run, restart it with
--resume; every batch is trained exactly once. Also: --resume with nothing to resume fails
and says so, and a fresh start refuses to overwrite a checkpoint."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rlbus.bus import Bus
from rlbus.config import Settings, settings_variables
from rlbus.consumers.inference.model_init import init_model
from rlbus.schemas import TrainBatch, TrainSample, derived_id, masks
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"
# The worker commands as `rlbus worker ...` runs them, assembled here so the test does not
# depend on which other command modules rlbus.cli registers.
CLI = (
    "import typer; from rlbus.commands.worker import register; app = typer.Typer(); "
    "worker = typer.Typer(); app.add_typer(worker, name='worker'); register(app, worker); app()"
)


def trainer_process(settings: Settings, args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, **settings_variables(settings), "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", CLI, "worker", "trainer", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def batch(run_id: str, step: int) -> TrainBatch:
    rng = np.random.default_rng(step)
    samples = []
    for i in range(48):
        ids = rng.integers(0, 255, 40)
        m = np.r_[np.zeros(20), np.full(20, masks.SUPERVISED)].astype(np.uint8)
        samples.append(
            TrainSample(
                rollout_id=f"{step}-{i}",
                input_ids=pack_tokens(ids),
                loss_mask=pack_mask(m),
                advantages=pack_logprobs(m > 0),
                inference_logprobs=pack_logprobs(np.zeros(40)),
                # Sampled by the version batch `step` is trained on: never dropped as stale, so
                # every step trains (all-stale steps took no time, and the trainer could
                # finish before the test saw the version to kill it at).
                policy_version=step - 1,
            )
        )
    batch_id = derived_id(run_id, "batch", step)
    return TrainBatch(
        event_id=batch_id, run_id=run_id, batch_id=batch_id, step=step, samples=samples
    )


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint_every", [1, 4])
def test_killed_trainer_resumes_and_trains_every_batch_once(
    settings: Settings, tmp_path: Path, checkpoint_every: int
) -> None:
    """With checkpoint_every = 4 it is killed after weights 6, past its state of step 4: the
    batches of steps 5 and 6 were trained but not saved, so they must come back."""
    model = tmp_path / "tiny"
    init_model(model, seed=0)
    steps = 12
    ckpt = tmp_path / "ckpt"
    args = [
        "--config",
        str(EXAMPLE / "rl.toml"),
        "--model",
        str(model),
        "--max-steps",
        str(steps),
        "--trainer.checkpoint-url",
        str(ckpt),
        "--trainer.threads",
        "1",
        "--trainer.checkpoint-every",
        str(checkpoint_every),
    ]
    log = tmp_path / "trainer.log"

    nothing = subprocess.run(
        [sys.executable, "-c", CLI, "worker", "trainer", *args, "--resume"],
        capture_output=True,
        text=True,
        env={**os.environ, **settings_variables(settings)},
        timeout=120,
        check=False,
    )
    assert nothing.returncode == 2 and "nothing to resume" in nothing.stderr

    async def publish() -> None:
        async with Bus.of(settings) as bus:
            await bus.publish_many([batch(settings.run_id, s) for s in range(1, steps + 1)])

    asyncio.run(publish())
    first = trainer_process(settings, args, log)
    latest = ckpt / "latest.json"
    deadline = time.monotonic() + 180
    # Past a state but short of the next one: with states every 4 steps, kill once version 5 is
    # out, three steps before the next state (under load the kill lands a step or two late).
    past = 3 if checkpoint_every == 1 else checkpoint_every + 1
    while not (ckpt / "weights" / f"v{past:06d}.safetensors").exists():
        assert first.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    first.kill()
    first.wait()
    killed_at = json.loads(latest.read_text())["step"]
    assert killed_at < steps, (
        "the trainer finished before it could be killed; make the batches bigger"
    )
    if checkpoint_every > 1:
        next_state = 2 * checkpoint_every
        assert killed_at < next_state, "killed after its next state; make the batches bigger"

    again = subprocess.run(
        [sys.executable, "-c", CLI, "worker", "trainer", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **settings_variables(settings)},
        timeout=120,
        check=False,
    )
    assert again.returncode == 2 and "--resume" in again.stderr  # never a silent fresh start

    second = trainer_process(settings, [*args, "--resume"], log)
    assert second.wait(timeout=240) == 0, log.read_text()[-3000:]
    meta_dir = ckpt / json.loads(latest.read_text())["state"]
    meta = json.loads((meta_dir / "meta.json").read_text())
    assert meta["step"] == steps
    assert meta["batch_ids"] == [
        derived_id(settings.run_id, "batch", s) for s in range(1, steps + 1)
    ]
    print(f"killed after step {killed_at}; resumed to step {meta['step']}, each batch once")
