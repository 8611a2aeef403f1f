"""The built-in engine against a bare `model.generate` on the real SmolLM2-135M-Instruct.

32 reverse_text prompts (the env's system prompt, SmolLM2's ChatML template), 16 tokens each
(temperature 1, EOS ignored so every sequence has the same length), all 32 at once: the
engine gets 32 concurrent requests, `model.generate` one left-padded batch of 32. Trials
alternate; each figure is the best of its trials. The engine's mean decode batch is printed
too: below 32 means requests were not admitted together.

    python bench/smollm2_inference.py [--model /work/cache/smollm2] [--trials 2] [--threads 1]

Last line: RESULT engine_vs_generate=<engine tok/s / generate tok/s>
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlbus.clients.renderer import make_renderer
from rlbus.consumers.inference.api import SamplingParams
from rlbus.consumers.inference.engine import Engine

BATCH, TOKENS = 32, 16
SYSTEM = "Reverse the text you are given. Answer with the reversed text only."
WORDS = [f"{a}{b}{c}" for a in "abcd" for b in "efgh" for c in "ij"][:BATCH]


def prompts(tokenizer) -> list[list[int]]:
    renderer = make_renderer(tokenizer)
    return [
        renderer.render([{"role": "system", "content": SYSTEM}, {"role": "user", "content": w}])
        for w in WORDS
    ]


def bare_generate(model, tokenizer, ids: list[list[int]]) -> float:
    width = max(len(p) for p in ids)
    pad = tokenizer.pad_token_id
    batch = torch.tensor([[pad] * (width - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=batch,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            max_new_tokens=TOKENS,
            min_new_tokens=TOKENS,
            pad_token_id=pad,
        )
    assert out.shape[1] - width == TOKENS
    return BATCH * TOKENS / (time.perf_counter() - started)


async def engine_generate(engine: Engine, ids: list[list[int]]) -> float:
    params = SamplingParams(temperature=1.0, max_tokens=TOKENS, ignore_eos=True)
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, params) for p in ids))
    assert all(len(r.completion_ids) == TOKENS for r in results)
    return BATCH * TOKENS / (time.perf_counter() - started)


async def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    ids = prompts(tokenizer)
    engine_best = generate_best = 0.0
    async with Engine(model, tokenizer, max_batch_size=64) as engine:
        for trial in range(args.trials):
            engine_best = max(engine_best, await engine_generate(engine, ids))
            generate_best = max(generate_best, bare_generate(model, tokenizer, ids))
            print(f"trial {trial}: engine {engine_best:.1f} tok/s, generate {generate_best:.1f}")
        stats = engine.stats()
    print(f"engine mean decode batch {stats.mean_batch_size:.1f} of {BATCH}")
    print(f"engine {engine_best:.1f} tok/s, model.generate {generate_best:.1f} tok/s")
    print(f"RESULT engine_vs_generate={engine_best / generate_best:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="/work/cache/smollm2", help="SmolLM2 directory")
    parser.add_argument("--trials", type=int, default=2, help="alternating trials of each")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    asyncio.run(main(parser.parse_args()))
