"""The static KV cache a GPU's decode runs in (slots.py): the same logits as the padded batch
through joins, leaves and compaction, steps that never read the device back (so that CUDA can
capture them), and a context bounded by the cache. The capture itself needs CUDA
(bench/gpu.py); the engine tests run both decodes (test_inference_engine.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, PreTrainedModel

from rlbus.config.base import ConfigError
from rlbus.config.loading import load_settings
from rlbus.config.runs import HFEngineConfig, InferenceConfig, InferenceSettings
from rlbus.consumers.inference.api import ContextLengthError, SamplingParams
from rlbus.consumers.inference.batch import PaddedBatch
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.service import build_backend
from rlbus.consumers.inference.slots import SlotBatch, buckets, round_up
from rlbus.launch.supervisor import engine_overrides

# Ops that copy a device value to the host: a CUDA graph cannot capture them.
HOST_READS = {
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::is_nonzero",
    "aten::nonzero",
    "aten::masked_select",
    "aten::_unique2",
    "aten::equal",
}


class HostReads(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in HOST_READS:
            self.seen.append(func._schema.name)
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama-tiny")
    init_model(path, arch="llama", size="tiny", seed=0)
    return path


def load(model_dir: Path, attention: str = "sdpa") -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attention).eval()


def test_buckets_double_up_to_the_largest() -> None:
    assert buckets(1, 256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert buckets(1, 48) == [1, 2, 4, 8, 16, 32, 48]
    assert buckets(256, 256) == [256]
    assert round_up(33, buckets(1, 48)) == 48
    with pytest.raises(ValueError, match="more than the largest bucket 48"):
        round_up(49, buckets(1, 48))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_slots_give_the_padded_batchs_logits_through_joins_leaves_and_compaction(
    model_dir: Path, attention: str
) -> None:
    """Both batches run in lockstep over the same sequences; rows leave (from the top slots,
    so the rest move down) and join between steps. Every step's logits agree row by row."""
    model = load(model_dir, attention)
    generator = torch.Generator().manual_seed(0)

    def sequences(n: int) -> list[list[int]]:
        lengths = torch.randint(3, 40, (n,), generator=generator).tolist()
        return [torch.randint(5, 200, (k,), generator=generator).tolist() for k in lengths]

    slots = SlotBatch(model, 16, 128)
    worst = 0.0
    with torch.inference_mode():
        first = sequences(12)
        padded, logits = PaddedBatch.prefill(model, first)
        slotted, _ = PaddedBatch.prefill(model, first)
        slots.restart(slotted)
        tokens = logits.argmax(-1)
        for step in range(24):
            expected = padded.decode(model, tokens)
            got = slots.decode(model, tokens)
            worst = max(worst, (expected - got).abs().max().item())
            tokens = expected.argmax(-1)
            if step in (3, 9, 15):
                # Keep every other row, the last ones leaving: those in the highest slots.
                keep = torch.arange(0, padded.size, 2)
                padded.select(keep)
                slots.select(keep)
                tokens = tokens.index_select(0, keep)
            if step in (5, 12):
                joining = sequences(5)
                new_padded, new_logits = PaddedBatch.prefill(model, joining)
                new_slotted, _ = PaddedBatch.prefill(model, joining)
                padded.merge(new_padded)
                slots.merge(new_slotted)
                tokens = torch.cat([tokens, new_logits.argmax(-1)])
    assert slots.size == padded.size
    # After the third leave 3 rows remain of 16 slots: they moved down into a 4-slot bucket.
    batch, _ = slots.shape()
    assert batch == round_up(slots.size, slots.batch_buckets), (batch, slots.size)
    assert worst < 1e-4, worst


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_step_reads_nothing_back_and_keeps_its_tensors(model_dir: Path, attention: str) -> None:
    """What a CUDA graph needs of a step: no value copied to the host inside it (a capture
    fails on one), and the same cache tensors whatever joins and leaves."""
    model = load(model_dir, attention)
    slots = SlotBatch(model, 8, 64)
    addresses = [layer.all_keys.data_ptr() for layer in slots.cache.slot_layers]
    with torch.inference_mode():
        batch, _ = PaddedBatch.prefill(model, [[5, 6, 7], [8, 9], [10, 11, 12, 13]])
        slots.restart(batch)
        with HostReads() as reads:
            for bucket in slots.batch_buckets:
                slots.step(bucket, 64)
        slots.select(torch.tensor([2]))
        slots.decode(model, torch.tensor([14]))
    assert reads.seen == []
    assert [layer.all_keys.data_ptr() for layer in slots.cache.slot_layers] == addresses


async def test_the_cache_bounds_the_context(model_dir: Path) -> None:
    async with Engine.from_pretrained(model_dir, decode="static", cache_length=64) as engine:
        assert engine.max_context == 64
        with pytest.raises(ContextLengthError):
            await engine.generate(list(range(5, 70)))
        # A request without max_tokens runs to the last position the cache holds.
        prompt = list(range(5, 55))
        result = await engine.generate(prompt, SamplingParams(temperature=0, ignore_eos=True))
        assert (len(result.completion_ids), result.finish_reason) == (14, "length")


async def test_more_requests_than_slots_queue_and_reuse_slots(model_dir: Path) -> None:
    """40 greedy requests of unequal lengths through 8 slots, against the dynamic decode."""
    got = {}
    for decode in ("dynamic", "static"):
        engine = Engine.from_pretrained(
            model_dir, decode=decode, cache_length=128, max_batch_size=8
        )
        async with engine:
            requests = [
                (
                    list(range(5, 9 + i % 11)),
                    SamplingParams(max_tokens=3 + 5 * (i % 4), temperature=0),
                )
                for i in range(40)
            ]
            got[decode] = await asyncio.gather(*(engine.generate(p, s) for p, s in requests))
            assert engine.stats().mean_batch_size > 4
    for dynamic, static in zip(got["dynamic"], got["static"], strict=True):
        assert static.completion_ids == dynamic.completion_ids
        gaps = [abs(a - b) for a, b in zip(static.logprobs, dynamic.logprobs, strict=True)]
        assert max(gaps) < 1e-4


def test_the_hf_table_reaches_the_engine(model_dir: Path) -> None:
    """`[inference.hf]` in a run's TOML becomes the worker's overrides (rlbus run starts the
    worker with them), and those build the engine they describe; a bad value names its field."""
    run_table = InferenceConfig(hf=HFEngineConfig(decode="static", cache_length=64))
    overrides = engine_overrides(run_table)
    worker = load_settings(overrides=overrides, model=InferenceSettings).inference.hf
    assert worker == run_table.hf
    engine = build_backend(model_dir, "hf", hf=worker)
    assert isinstance(engine, Engine) and engine.max_context == 64
    with pytest.raises(ConfigError, match="inference.hf.decode"):
        load_settings(overrides=["--inference.hf.decode", "graphs"], model=InferenceSettings)
