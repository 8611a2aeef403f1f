"""The trainer across ranks with torchtitan, on 2 CPU processes (gloo): torchtitan's Llama
definition loaded with a Hugging Face directory's weights gives the transformers model's
logits; parallelized by torchtitan (FSDP2), one step over a batch gives the single-process
trainer's loss and gradient norm, and publishes the same weights under the same names, which
load into the transformers model that inference serves. (CPU/gloo only here: torchtitan's
CUDA parts, NCCL, tensor/context/pipeline parallelism, compile and float8 are not run.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_trainer_fsdp import batch, cfg
from transformers import AutoConfig, AutoModelForCausalLM

from rlbus.bus import free_port
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.trainer.session import open_session
from rlbus.consumers.trainer.titan import decoder_config, hf_state


def worker(rank: int, port: int, model: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        session = open_session(cfg("torchtitan"), model, f"{out}/ckpt", 10, resume=False)
        result = session.trainer.step(batch(), 0)
        weights = session.hooks.weights()
        if rank == 0:
            torch.save(
                {"loss": result.loss, "grad_norm": result.grad_norm, "weights": weights},
                f"{out}/titan.pt",
            )
    finally:
        dist.destroy_process_group()


def tied_model(path: Path) -> Path:
    """A tiny Llama whose head is its embedding (SmolLM2's layout), from `rlbus model init`'s."""
    init_model(path, seed=0)
    config = AutoConfig.from_pretrained(path)
    config.tie_word_embeddings = True
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True], ids=["own-head", "tied-head"])
def test_torchtitan_ranks_train_to_the_single_process_loss(tmp_path: Path, tied: bool) -> None:
    model = tmp_path / "tiny"
    tied_model(model) if tied else init_model(model, seed=0)
    mp.spawn(worker, args=(free_port(), str(model), str(tmp_path)), nprocs=2, join=True)
    titan = torch.load(tmp_path / "titan.pt")
    single = open_session(cfg("none"), str(model), str(tmp_path / "single"), 10, resume=False)
    result = single.trainer.step(batch(), 0)
    assert titan["loss"] == pytest.approx(result.loss, abs=1e-4)
    assert titan["grad_norm"] == pytest.approx(result.grad_norm, rel=1e-4)
    expected = single.hooks.weights()
    assert set(titan["weights"]) == set(expected)
    for name, tensor in expected.items():
        # One AdamW step moves every weight by about lr (1e-2), whatever its gradient's size;
        # where a gradient is near zero (AdamW's eps) the step's size follows that gradient's
        # rounding, which differs between the two definitions (complex vs half-rotated rotary
        # tables, SDPA vs eager attention). So nearly every weight agrees to 2e-5, and every
        # one to well within a step: a wrong or missing update is off by ~1e-2.
        diff = (titan["weights"][name] - tensor).abs()
        assert diff.max() < 2e-3 and (diff > 2e-5).float().mean() < 1e-3, name
    # What inference does with a published version: load it into the transformers model.
    served = AutoModelForCausalLM.from_pretrained(model)
    missing, unexpected = served.load_state_dict(titan["weights"], strict=False)
    assert unexpected == [] and set(missing) <= ({"lm_head.weight"} if tied else set())


def test_torchtitan_decoder_gives_the_transformers_logits(tmp_path: Path) -> None:
    """One process, no sharding: the conversion alone (torchtitan's state-dict adapter and its
    rotary layout) against transformers, on the same weights."""
    path = tied_model(tmp_path / "tiny")
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    config = decoder_config(hf.config)
    decoder = config.build()
    decoder.init_states(buffer_device=torch.device("cpu"))
    from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter

    adapter = Llama3StateDictAdapter(config, None)
    missing, unexpected = decoder.load_state_dict(adapter.from_hf(hf_state(path)), strict=False)
    assert (missing, unexpected) == ([], [])
    ids = torch.randint(0, hf.config.vocab_size, (3, 21))
    with torch.no_grad():
        torch.testing.assert_close(decoder(ids), hf(input_ids=ids).logits, atol=1e-5, rtol=1e-4)


def test_a_model_torchtitan_does_not_define_is_refused_naming_the_way_out(tmp_path: Path) -> None:
    init_model(tmp_path / "qwen", arch="qwen3", seed=0)
    with pytest.raises(ValueError, match=r"this model is 'qwen3': use trainer.parallel = 'fsdp'"):
        decoder_config(AutoConfig.from_pretrained(tmp_path / "qwen"))
