"""The FSDP2 trainer on 2 CPU processes (gloo): one step over the same batch gives the same
loss and weights as the single-process trainer, and its full-state checkpoint resumes in one
process. (CPU/gloo only here: no NCCL, no GPUs; torchrun + bus wiring is not run.)"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlbus.bus import free_port
from rlbus.config.trainer import TrainerConfig
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.trainer.session import open_session
from rlbus.schemas import TrainSample, masks
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens


def batch() -> list[TrainSample]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(6):
        n = int(rng.integers(8, 20))
        m = np.r_[np.zeros(4), np.full(n - 4, masks.POLICY if i % 2 else masks.SUPERVISED)].astype(
            np.uint8
        )
        out.append(
            TrainSample(
                rollout_id=str(i),
                input_ids=pack_tokens(rng.integers(0, 255, n)),
                loss_mask=pack_mask(m),
                advantages=pack_logprobs((m > 0) * rng.normal()),
                inference_logprobs=pack_logprobs(-rng.random(n)),
            )
        )
    return out


def cfg(parallel: str) -> TrainerConfig:
    # micro_batch_tokens small enough that the 6 samples split over several micro-batches
    return TrainerConfig.model_validate(
        {"parallel": parallel, "micro_batch_tokens": 40, "threads": 1, "optim": {"lr": 1e-2}}
    )


def worker(rank: int, port: int, model: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        session = open_session(cfg("fsdp"), model, f"{out}/ckpt", 10, resume=False)
        result = session.trainer.step(batch(), 0)
        weights = session.hooks.weights()
        state = session.hooks.state()
        if rank == 0:
            torch.save(
                {"loss": result.loss, "grad_norm": result.grad_norm, "weights": weights},
                f"{out}/fsdp.pt",
            )
            session.state.step = 1
            session.checkpoints.save(session.state, state)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_step_matches_single_process_and_checkpoints_interchange(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    init_model(model, seed=0)
    mp.spawn(worker, args=(free_port(), str(model), str(tmp_path)), nprocs=2, join=True)
    fsdp = torch.load(tmp_path / "fsdp.pt")
    single = open_session(cfg("none"), str(model), str(tmp_path / "single"), 10, resume=False)
    result = single.trainer.step(batch(), 0)
    assert fsdp["loss"] == pytest.approx(result.loss, rel=1e-4)
    assert fsdp["grad_norm"] == pytest.approx(result.grad_norm, rel=1e-4)
    expected = single.hooks.weights()
    assert set(fsdp["weights"]) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(fsdp["weights"][name], tensor, atol=2e-5, rtol=1e-4)
    resumed = open_session(cfg("none"), str(model), str(tmp_path / "ckpt"), 10, resume=True)
    assert resumed.state.step == 1
    for name, tensor in resumed.hooks.weights().items():
        torch.testing.assert_close(tensor, expected[name], atol=2e-5, rtol=1e-4)
