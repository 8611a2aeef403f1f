"""Throughput and latency of the built-in inference engine against a bare `model.generate` loop.

A tiny Llama (~0.9M parameters, built from a config) generates 64 tokens per request for 64
chat prompts. The engine serves 1, 16 and 64 concurrent requests; the baseline calls
`model.generate` on the same prompts with batch 1, 16 and 64 (left padding), same sampling
(temperature 1, no top-k/top-p, EOS ignored so every sequence has the same length). Trials
of the two alternate, and each figure is the best of the trials, so load from other
processes on a shared machine hurts both sides alike rather than whichever ran at the time.

One intra-op thread by default: on a shared 2-core machine two threads made both sides 4-15x
slower and erratic whenever another process was busy (torch's thread pool waits for a
descheduled worker), while for a model this small one thread is as fast as two on an idle box.

Time to first token at concurrency 1: the engine streams (`engine.stream`, what the servers'
streams read), so its first token arrives after one prefill and one sampling step, while
`model.generate` hands over all its tokens at its end; next to it, `generate` asked for one
token (the floor: prefill and one step, no streaming overhead).

    python bench/inference.py [--tokens 64] [--trials 5] [--threads 1]

Last line: RESULT c64_vs_generate=<engine tok/s / generate tok/s at 64>
                  c1_latency_vs_generate=<engine latency / generate latency at 1>
                  c1_ttft_vs_generate=<engine time to first token / generate latency at 1>
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass

import timed_generate
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from transformers import PreTrainedModel

from rlbus.clients.renderer import TemplateRenderer
from rlbus.consumers.inference.api import Delta, SamplingParams
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model

CONCURRENCY = (1, 16, 64)
C1_REQUESTS = 4  # latency at concurrency 1 is the mean over this many prompts, one at a time

console = Console()


@dataclass
class Figure:
    seconds: float
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def chat_prompts(engine: Engine, n: int) -> list[list[int]]:
    renderer = TemplateRenderer(engine.tokenizer)
    topics = [
        "rivers",
        "prime numbers",
        "sorting",
        "tea",
        "chess",
        "volcanoes",
        "compilers",
        "bees",
    ]
    return [
        renderer.render(
            [
                {
                    "role": "user",
                    "content": f"Tell me about {topics[i % 8]} ({i})." + " Please." * (i % 4),
                }
            ]
        )
        for i in range(n)
    ]


def bare_generate(
    baseline: PreTrainedModel, engine: Engine, prompts: list[list[int]], tokens: int
) -> Figure:
    """One `model.generate` call of the stock model over the prompts as one left-padded batch."""
    seconds = timed_generate.bare_generate(baseline, engine.tokenizer, prompts, tokens)
    return Figure(seconds, tokens * len(prompts))


async def engine_generate(engine: Engine, prompts: list[list[int]], tokens: int) -> Figure:
    """All prompts submitted at once, as concurrent clients would."""
    seconds = await timed_generate.engine_generate(engine, prompts, tokens)
    return Figure(seconds, tokens * len(prompts))


async def engine_first_token(engine: Engine, prompt: list[int], tokens: int) -> float:
    """Seconds until the engine's stream hands over its first token (the stream is read to its
    end, as a client would)."""
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    started = time.perf_counter()
    first = None
    async for item in engine.stream(prompt, params):
        if first is None and isinstance(item, Delta):
            first = time.perf_counter() - started
    assert first is not None
    return first


async def first_tokens(
    engine: Engine, baseline: PreTrainedModel, prompts: list[list[int]], tokens: int
) -> tuple[float, float]:
    """Mean time to first token over the single-client prompts: (engine stream, generate of
    one token)."""
    single = prompts[:C1_REQUESTS]
    streamed = [await engine_first_token(engine, p, tokens) for p in single]
    floor = [bare_generate(baseline, engine, [p], 1).seconds for p in single]
    return sum(streamed) / len(single), sum(floor) / len(single)


def per_request(figures: list[Figure]) -> Figure:
    """Mean latency and tokens of requests run one at a time."""
    return Figure(
        sum(f.seconds for f in figures) / len(figures),
        sum(f.tokens for f in figures) // len(figures),
    )


async def one_trial(
    engine: Engine, baseline: PreTrainedModel, prompts: list[list[int]], c: int, tokens: int
) -> tuple[Figure, Figure]:
    if c == 1:
        single = prompts[:C1_REQUESTS]
        return (
            per_request([await engine_generate(engine, [p], tokens) for p in single]),
            per_request([bare_generate(baseline, engine, [p], tokens) for p in single]),
        )
    return await engine_generate(engine, prompts[:c], tokens), bare_generate(
        baseline, engine, prompts[:c], tokens
    )


def fastest(figures: list[Figure]) -> Figure:
    return min(figures, key=lambda f: f.seconds / f.tokens)


async def measure(
    engine: Engine, baseline: PreTrainedModel, tokens: int, trials: int
) -> tuple[dict[int, tuple[Figure, Figure]], tuple[float, float]]:
    """{concurrency: (engine, generate)}, each the fastest of `trials` alternating trials, and
    the fastest (engine, one-token generate) time to first token at concurrency 1."""
    prompts = chat_prompts(engine, max(CONCURRENCY))
    best: dict[int, tuple[Figure, Figure]] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("measuring", total=(len(CONCURRENCY) + 1) * (trials + 1))
        for c in CONCURRENCY:
            progress.update(task, description=f"concurrency {c}")
            runs = [
                await one_trial(engine, baseline, prompts, c, tokens) for _ in range(trials + 1)
            ]
            progress.advance(task, trials + 1)
            kept = runs[1:]  # the first trial warms both sides up
            best[c] = (fastest([e for e, _ in kept]), fastest([g for _, g in kept]))
        progress.update(task, description="time to first token")
        firsts = [await first_tokens(engine, baseline, prompts, tokens) for _ in range(trials + 1)][
            1:
        ]
        progress.advance(task, trials + 1)
    return best, (min(f for f, _ in firsts), min(g for _, g in firsts))


async def main(tokens: int, trials: int, threads: int) -> None:
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        params = init_model(tmp, arch="llama", size="tiny", seed=0)
        async with Engine.from_pretrained(tmp) as engine:
            console.print(
                f"tiny llama, {params:,} parameters, fp32 on CPU "
                f"({torch.get_num_threads()} threads); "
                f"{tokens} tokens per request, best of {trials} alternating trials"
            )
            baseline = timed_generate.stock_model(tmp)
            best, (ttft, one_token) = await measure(engine, baseline, tokens, trials)
            mean_batch = engine.stats().mean_batch_size
    table = Table(title="engine vs bare model.generate (same prompts, same run)")
    for column in (
        "clients",
        "engine tok/s",
        "generate tok/s",
        "ratio",
        "latency (engine/generate)",
    ):
        table.add_column(column, justify="right")
    for c, (eng, gen) in best.items():
        latency = ""
        if c == 1:
            ratio = eng.seconds / gen.seconds
            latency = f"{eng.seconds * 1000:.0f} / {gen.seconds * 1000:.0f} ms = {ratio:.2f}"
        table.add_row(
            str(c),
            f"{eng.tokens_per_s:,.0f}",
            f"{gen.tokens_per_s:,.0f}",
            f"{eng.tokens_per_s / gen.tokens_per_s:.2f}",
            latency,
        )
    console.print(table)
    console.print(
        f"engine mean batch size over all engine runs (1, 16 and 64 clients): {mean_batch:.1f}"
    )
    generate_s = best[1][1].seconds
    console.print(
        f"time to first token, 1 client: engine stream {ttft * 1000:.1f} ms; bare generate "
        f"{generate_s * 1000:.1f} ms (its first token comes with its last); generate of one "
        f"token {one_token * 1000:.1f} ms"
    )
    c64 = best[64][0].tokens_per_s / best[64][1].tokens_per_s
    c1 = best[1][0].seconds / generate_s
    print(
        f"RESULT c64_vs_generate={c64:.3f} c1_latency_vs_generate={c1:.3f} "
        f"c1_ttft_vs_generate={ttft / generate_s:.3f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument(
        "--trials", type=int, default=5, help="alternating trials per figure (best kept)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads, for both sides"
    )
    args = parser.parse_args()
    asyncio.run(main(args.tokens, args.trials, args.threads))
