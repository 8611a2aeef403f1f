"""The two ways the inference benches generate the same tokens, timed alike: one bare
`model.generate` call over a left-padded batch, and the built-in engine with every prompt
submitted at once (as concurrent clients would). EOS is ignored in both, so each prompt gets
exactly `tokens` new tokens and the figures compare like with like."""

from __future__ import annotations

import asyncio
import time
from typing import Any


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def stock_model(path: Any, device: str = "cpu", dtype: Any = None) -> Any:
    """The model as transformers runs it, for the baseline: the engine repacks the linear layers
    of its own copy (consumers/inference/packed_linear.py)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval()


def bare_generate(model: Any, tokenizer: Any, prompts: list[list[int]], tokens: int) -> float:
    """Seconds for one `model.generate` over the prompts as one left-padded batch."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    device = model.device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    synchronize(str(device))
    started = time.perf_counter()
    with torch.inference_mode():
        # Keyword arguments: in a GenerationConfig, eos_token_id=None means the model's EOS.
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            eos_token_id=None,
            pad_token_id=pad,
        )
    synchronize(str(device))
    seconds = time.perf_counter() - started
    if out.shape[1] - width != tokens:
        raise RuntimeError(f"generate stopped after {out.shape[1] - width} of {tokens} tokens")
    return seconds


async def engine_generate(engine: Any, prompts: list[list[int]], tokens: int) -> float:
    """Seconds for the engine to finish every prompt, all submitted at once."""
    from rlbus.clients.token_api import SamplingParams

    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    seconds = time.perf_counter() - started
    got = sum(len(r.completion_ids) for r in results)
    if got != tokens * len(prompts):
        raise RuntimeError(f"the engine generated {got} of {tokens * len(prompts)} tokens")
    return seconds
