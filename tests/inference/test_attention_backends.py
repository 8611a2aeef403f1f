"""The engine's attention choice: sdpa, and every SDPA backend but cuDNN on CUDA (its per-call
CPU cost); on a CPU, torch's choice as before. No GPU here: the CUDA choice is checked as a
choice, and its flags on a CPU forward (where flash and math stay allowed)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from rlbus.consumers.inference import engine as engine_module
from rlbus.consumers.inference.api import SamplingParams
from rlbus.consumers.inference.attention import (
    allowed_attention_backends,
    attention_backends,
    attention_implementation,
)
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model

CUDA_CHOICE = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def flags() -> dict[str, bool]:
    cuda = torch.backends.cuda
    return {
        "cudnn": cuda.cudnn_sdp_enabled(),
        "flash": cuda.flash_sdp_enabled(),
        "efficient": cuda.mem_efficient_sdp_enabled(),
        "math": cuda.math_sdp_enabled(),
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama-tiny-attention")
    init_model(path, arch="llama", size="tiny", seed=0)
    return path


@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_cuda_allows_every_backend_but_cudnn(device: str | torch.device) -> None:
    assert attention_backends(device) == CUDA_CHOICE
    assert SDPBackend.CUDNN_ATTENTION not in CUDA_CHOICE
    assert attention_implementation(device) == "sdpa"


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "meta"])
def test_other_devices_keep_torchs_choice(device: str | torch.device) -> None:
    assert attention_backends(device) is None
    assert attention_implementation(device) is None


def test_the_hold_is_process_wide_counted_and_restored() -> None:
    before = flags()
    assert before["cudnn"], "this test expects torch's default flags"
    inside, release, seen = threading.Barrier(3), threading.Event(), []

    def holder() -> None:
        with allowed_attention_backends(CUDA_CHOICE):
            inside.wait()
            release.wait()

    threads = [threading.Thread(target=holder) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    seen.append(flags())  # from another thread than the holders'
    release.set()
    for t in threads:
        t.join()
    assert seen == [{"cudnn": False, "flash": True, "efficient": True, "math": True}]
    assert flags() == before

    with allowed_attention_backends(None):
        assert flags() == before
    with allowed_attention_backends(CUDA_CHOICE):
        with pytest.raises(RuntimeError, match="process-wide"):
            with allowed_attention_backends([SDPBackend.MATH]):
                pass
        assert not flags()["cudnn"]
    assert flags() == before


def test_the_cuda_choice_leaves_a_cpu_forward_bit_identical(model_dir: Path) -> None:
    model = Engine.from_pretrained(model_dir).model
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    mask = (ids != 0).long()
    with torch.inference_mode():
        plain = model(input_ids=ids, attention_mask=mask).logits
        with sdpa_kernel(CUDA_CHOICE):
            chosen = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(plain, chosen)


async def run(engine: Engine, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    out = []
    async with engine:
        for prompt in prompts:  # one at a time: a batch of one, so the runs compare exactly
            result = await engine.generate(prompt, SamplingParams(max_tokens=12, seed=3))
            out.append((result.completion_ids, result.logprobs))
    return out


async def test_cpu_engine_enters_no_backend_choice(model_dir: Path) -> None:
    engine = Engine.from_pretrained(model_dir)
    seen: list[bool] = []
    engine.model.register_forward_pre_hook(lambda *_: seen.append(flags()["cudnn"]))
    await run(engine, [[1, 2, 3, 4]])
    assert seen and all(seen)


async def test_engine_holds_the_cuda_choice_on_its_thread_and_logprobs_stay_exact(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA choice forced onto a CPU engine: every forward runs with cuDNN off, the flags
    come back when the engine stops, and tokens and log-probs equal the default engine's."""
    prompts = [[1, 2, 3, 4], [20, 21, 22, 23, 24, 25, 26], [7]]
    default = await run(Engine.from_pretrained(model_dir), prompts)
    monkeypatch.setattr(engine_module, "attention_backends", lambda device: CUDA_CHOICE)
    engine = Engine.from_pretrained(model_dir)
    seen: list[bool] = []
    engine.model.register_forward_pre_hook(lambda *_: seen.append(flags()["cudnn"]))
    before = flags()
    chosen = await run(engine, prompts)
    assert seen and not any(seen)
    assert flags() == before
    assert chosen == default
