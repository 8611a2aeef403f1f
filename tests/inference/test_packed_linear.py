"""The engine's packed linear layers against the model as transformers runs it: same logits,
same parameters, repacked when a weight changes in place, plain when gradients are on. The
"small" test model (~27M) has layers on both sides of MIN_WEIGHTS."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.packed_linear import MIN_WEIGHTS, PackedLinear, pack_linears

IDS = torch.tensor([[5, 17, 42, 9, 3, 77, 12], [8, 8, 1, 64, 30, 2, 19]])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama-small")
    init_model(path, arch="llama", size="small", seed=0)
    return path


def load(path: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(path).eval()


def logits(model: PreTrainedModel) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=IDS).logits


def test_packed_layers_compute_what_the_stock_model_computes(model_dir: Path) -> None:
    stock, packed = load(model_dir), load(model_dir)
    linears = [m for m in stock.modules() if type(m) is torch.nn.Linear]
    large = sum(m.weight.numel() >= MIN_WEIGHTS for m in linears)
    names = [n for n, _ in stock.named_parameters()]
    assert pack_linears(packed) == large
    assert 0 < large < len(linears)  # both kinds take part below
    assert sum(type(m) is torch.nn.Linear for m in packed.modules()) == len(linears) - large
    assert [n for n, _ in packed.named_parameters()] == names  # swaps find them by name
    got, want = logits(packed), logits(stock)
    assert not torch.equal(got, torch.zeros_like(got))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_tied_head_stays_tied_to_the_embedding(smollm2_dir: Path) -> None:
    model = load(smollm2_dir)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    pack_linears(model)
    assert isinstance(model.lm_head, PackedLinear)
    assert model.lm_head.weight is model.get_input_embeddings().weight


def test_a_weight_changed_in_place_is_packed_again(model_dir: Path) -> None:
    stock, packed = load(model_dir), load(model_dir)
    pack_linears(packed)
    before = logits(packed)  # packs every layer
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():  # as the engine's weight swap does it
        for (_, mine), (_, theirs) in zip(
            packed.named_parameters(), stock.named_parameters(), strict=True
        ):
            new = theirs + 0.05 * torch.randn(theirs.shape, generator=generator)
            mine.copy_(new)
            theirs.copy_(new)
    after = logits(packed)
    assert (after - before).abs().max() > 1e-2  # the change shows
    torch.testing.assert_close(after, logits(stock), atol=1e-4, rtol=1e-4)


def test_with_gradients_on_the_layer_is_the_plain_one(model_dir: Path) -> None:
    model = load(model_dir)
    pack_linears(model)
    model(input_ids=IDS).logits.square().mean().backward()
    grad = model.model.layers[0].mlp.down_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0


async def test_the_engine_samples_with_the_stock_models_log_probs(model_dir: Path) -> None:
    """What the trainer computes (the stock layers) is what the engine recorded, per token."""
    from rlbus.consumers.inference.api import SamplingParams

    stock = load(model_dir)
    prompt = [5, 17, 42, 9, 3]
    async with Engine.from_pretrained(model_dir) as engine:
        assert any(isinstance(m, PackedLinear) for m in engine.model.modules())
        result = await engine.generate(prompt, SamplingParams(max_tokens=12, ignore_eos=True))
    with torch.inference_mode():
        full = stock(input_ids=torch.tensor([prompt + result.completion_ids])).logits[0]
    expected = torch.log_softmax(full.float(), -1)[len(prompt) - 1 : -1]
    expected = expected.gather(-1, torch.tensor(result.completion_ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(result.logprobs), expected, atol=1e-4, rtol=0)
