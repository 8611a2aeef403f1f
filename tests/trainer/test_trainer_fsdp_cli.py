"""Ranks from the command line: `rlbus run --trainer.parallel fsdp|torchtitan --trainer.ranks 2`
starts the second rank itself (gloo on CPU) and trains to max_steps; what cannot run says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.runs import EXAMPLE, rlbus_run

from rlbus.bus.store import open_store
from rlbus.consumers.inference.model_init import init_model

RL_TOML = EXAMPLE / "rl.toml"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("parallel", "says"),
    [("fsdp", "FSDP: 2 ranks (gloo)"), ("torchtitan", "torchtitan (FSDP2): 2 ranks (gloo)")],
)
def test_rlbus_run_trains_with_two_ranks(tmp_path: Path, parallel: str, says: str) -> None:
    model = tmp_path / "tiny"
    init_model(model, seed=0)
    run = rlbus_run(
        tmp_path, model, "--max-steps", "2", "--trainer.parallel", parallel, "--trainer.ranks", "2"
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (log_path,) = tmp_path.glob("**/runs/cli/logs/trainer.log")
    log = log_path.read_text()
    assert says in log, log[-3000:]
    with open_store(f"chdb://{tmp_path / 'store'}", read_only=True) as store:
        steps = store.query(
            "SELECT step, num_samples FROM train_steps FINAL WHERE run_id = 'cli' ORDER BY step"
        ).rows
    assert [step for step, _ in steps] == [1, 2] and all(n > 0 for _, n in steps)


def trainer(tmp: Path, *overrides: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "rlbus", "worker", "trainer", "-C", str(RL_TOML)]
    args += ["--kafka.bootstrap-servers", "127.0.0.1:1", *overrides]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp, check=False)


@pytest.mark.slow
def test_ranks_without_fsdp_are_refused_before_anything_starts(tmp_path: Path) -> None:
    result = trainer(tmp_path, "--trainer.ranks", "2")
    assert result.returncode != 0
    said = " ".join(result.stderr.split())  # as printed, wrapped to the terminal's width
    assert "trainer.ranks = 2 needs trainer.parallel = 'fsdp' or 'torchtitan'" in said


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs")
@pytest.mark.slow
def test_more_nccl_ranks_than_gpus_say_so(tmp_path: Path) -> None:
    fsdp = ["--trainer.parallel", "fsdp", "--trainer.ranks", "2", "--trainer.device", "cuda"]
    result = trainer(tmp_path, *fsdp)
    assert result.returncode == 1
    assert "trainer.ranks = 2 on trainer.device = 'cuda' needs 2 GPUs" in result.stderr
