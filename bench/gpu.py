"""rlbus's built-in engine and trainer on a CUDA GPU, and the FSDP2 trainer under nccl: the
check a session runs when it is lent a GPU (the device tool; this machine has none).

    python bench/gpu.py [--device cuda|cpu] [--sizes smollm2-shape,qwen0.5b-shape]
        [--dtypes float32,bfloat16] [--prompts 256] [--prompt-tokens 128] [--tokens 256]
        [--bandwidth-tbs TB/s]

Engine: `--prompts` prompts of `--prompt-tokens` tokens, each sampling `--tokens` more, all
submitted at once, on SmolLM2-135M's shape and a Qwen2.5-0.5B-like shape (random weights, the
byte tokenizer: nothing is downloaded), fp32 and bf16. It prints the engine's tokens/s as it
decodes on CUDA (static cache, captured graphs: consumers/inference/slots.py and
decode_graphs.py) with the capture's seconds, the same engine's dynamic decode (the padded batch
a CPU uses), one `model.generate` over the same prompts as a left-padded batch
(bench/timed_generate.py), `engine_vs_hf` (engine / generate), `engine_vs_roofline` (engine / the
tokens/s the GPU's memory bandwidth allows when each step reads the weights and the batch's KV
cache at the run's mean context) and the worst gap between the engine's log-probs and a plain
unbatched forward. Each size and dtype ends with a `RESULT engine ...` line. Trainer: one step
after a warm-up on the CPU, on the GPU, and as FSDP2 on one GPU under nccl (loss and grad norm
against the single-process GPU trainer's). A part that fails prints its traceback and the others
still run.

Without CUDA (or with --device cpu) the engine part alone runs, on the CPU (default: tiny,
fp32, 16 prompts x 16 tokens), decoding both ways without graphs.

On a machine with no package registry, carry what its image lacks as wheels (the device
README); `pip install --no-deps --no-build-isolation -e .` then installs rlbus.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from timed_generate import bare_generate, stock_model, synchronize
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, Qwen2Config

from rlbus.bus import free_port
from rlbus.clients.token_api import SamplingParams
from rlbus.config.trainer import TrainerConfig
from rlbus.consumers.inference.api import GenerateResult
from rlbus.consumers.inference.attention import attention_backends
from rlbus.consumers.inference.byte_tokenizer import build_byte_tokenizer
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.slots import bytes_per_slot_position
from rlbus.consumers.trainer.session import open_session
from rlbus.consumers.trainer.step import StepResult
from rlbus.schemas import TrainSample, masks
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens

CHECKED = 16
# SmolLM2-135M(-Instruct)'s architecture, where the engine's bf16 decode was measured to pay
# cuDNN attention's per-call CPU cost (issue 33).
SMOLLM2_SHAPE: dict[str, Any] = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
# Qwen2.5-0.5B's architecture (a larger vocabulary, biased q/k/v projections).
QWEN05_SHAPE: dict[str, Any] = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
# Memory bandwidth by GPU name (TB/s, the vendors' figures), for the roofline.
BANDWIDTH_TBS = {"H200": 4.8, "H100 SXM": 3.35, "H100 PCIe": 2.0, "H100": 3.35, "A100": 2.0}


def batch() -> list[TrainSample]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(8):
        n = int(rng.integers(64, 256))
        kind = masks.POLICY if i % 2 else masks.SUPERVISED
        m = np.r_[np.zeros(16), np.full(n - 16, kind)].astype(np.uint8)
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


def part(name: str, run: Callable[[], Any]) -> Any:
    print(f"== {name}", flush=True)
    try:
        return run()
    except Exception:
        traceback.print_exc()
        return None


def random_model(path: str, config: PretrainedConfig) -> int:
    """A model of `config`'s shape with random weights and the byte tokenizer (its speed, not
    its words: nothing is downloaded); returns #parameters."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    build_byte_tokenizer().save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def make_model(path: str, size: str) -> int:
    tok = build_byte_tokenizer()
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    if size == "smollm2-shape":
        return random_model(path, LlamaConfig(**ids, **SMOLLM2_SHAPE))
    if size == "qwen0.5b-shape":
        return random_model(path, Qwen2Config(**ids, **QWEN05_SHAPE))
    return init_model(path, size=size, seed=0)  # pyright: ignore[reportArgumentType]


def release(device: str) -> None:
    """Free what a finished part held before the next sizes its static cache from the free
    memory (a captured engine refers to itself through its graphs: only a collection frees it)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def bandwidth_tbs(device: str, given: float | None) -> float | None:
    if given is not None or device != "cuda":
        return given
    name = torch.cuda.get_device_name(0)
    return next((tbs for key, tbs in BANDWIDTH_TBS.items() if key in name), None)


def roofline_tok_s(engine: Engine, batch: int, context: float, tbs: float) -> float:
    """Tokens/s when every step reads the weights and `batch` rows of `context` positions of
    KV cache at `tbs` TB/s, and nothing else takes time."""
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    kv = batch * context * bytes_per_slot_position(engine.model)
    return batch / ((weights + kv) / (tbs * 1e12))


def backend_names(device: str) -> str:
    chosen = attention_backends(device)
    return "torch's default" if chosen is None else "/".join(b.name for b in chosen)


async def timed_engine(
    engine: Engine, prompts: list[list[int]], tokens: int, device: str
) -> tuple[float, list[GenerateResult]]:
    """Tokens/s of the engine over every prompt at once, after a warm-up on 8 of them."""
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, seed=1)
    async with engine:
        await asyncio.gather(*(engine.generate(p, params) for p in prompts[:8]))
        synchronize(device)
        started = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        synchronize(device)
        seconds = time.perf_counter() - started
    return sum(len(r.completion_ids) for r in results) / seconds, results


def worst_gap(
    model: Any, prompts: list[list[int]], results: list[GenerateResult], device: str
) -> float:
    """Worst |engine log-prob - plain unbatched forward| over CHECKED completions; run after the
    engine stopped, so the plain forward gets torch's default SDPA backends."""
    worst = 0.0
    for prompt, result in zip(prompts[:CHECKED], results[:CHECKED], strict=True):
        ids = torch.tensor([prompt + result.completion_ids], device=device)
        with torch.inference_mode():
            logits = model(ids).logits[0].float()
        chosen = torch.tensor(result.completion_ids, device=device)[:, None]
        plain = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(-1, chosen)
        gap = (plain.squeeze(-1).cpu() - torch.tensor(result.logprobs)).abs().max()
        worst = max(worst, gap.item())
    return worst


async def engine_run(
    model: str,
    size: str,
    device: str,
    dtype: torch.dtype,
    prompts: list[list[int]],
    tokens: int,
    tbs: float | None,
) -> None:
    engine = Engine.from_pretrained(model, device=device, dtype=dtype, decode="static")
    capture_s = engine.capture_s
    rate, results = await timed_engine(engine, prompts, tokens, device)
    worst = worst_gap(engine.model, prompts, results, device)
    context = sum(map(len, prompts)) / len(prompts) + tokens / 2
    roofline = roofline_tok_s(engine, len(prompts), context, tbs) if tbs else float("nan")
    del engine
    release(device)
    dynamic = Engine.from_pretrained(model, device=device, dtype=dtype, decode="dynamic")
    dynamic_rate, _ = await timed_engine(dynamic, prompts, tokens, device)
    del dynamic
    release(device)
    hf = stock_model(model, device, dtype)
    tokenizer = build_byte_tokenizer()
    bare_generate(hf, tokenizer, prompts[:8], 4)  # warm-up
    hf_rate = len(prompts) * tokens / bare_generate(hf, tokenizer, prompts, tokens)
    del hf
    release(device)
    name = str(dtype).removeprefix("torch.")
    print(
        f"engine {size} {name} on {device}, {len(prompts)} prompts x {tokens} tokens: "
        f"{rate:,.0f} tokens/s (graphs captured in {capture_s:.1f} s), {dynamic_rate:,.0f} "
        f"decoding dynamically; HF generate {hf_rate:,.0f} tokens/s; engine_vs_hf "
        f"{rate / hf_rate:.2f}; bandwidth limit {roofline:,.0f} tokens/s at {tbs} TB/s, "
        f"engine_vs_roofline {rate / roofline:.3f}; worst |log-prob - plain forward| over "
        f"{min(CHECKED, len(prompts))} completions {worst:.2e}",
        flush=True,
    )
    print(
        f"RESULT engine size={size} dtype={name} device={device} engine_tok_s={rate:.0f} "
        f"capture_s={capture_s:.1f} dynamic_tok_s={dynamic_rate:.0f} "
        f"hf_generate_tok_s={hf_rate:.0f} engine_vs_hf={rate / hf_rate:.3f} "
        f"engine_vs_roofline={rate / roofline:.4f} worst_logprob_gap={worst:.2e}",
        flush=True,
    )


def train(model: str, device: str, parallel: str, checkpoints: str) -> StepResult:
    """The second of two steps over the same batch (the first warms up)."""
    cfg = TrainerConfig.model_validate(
        {"parallel": parallel, "device": device, "micro_batch_tokens": 512, "threads": 4}
    )
    session = open_session(cfg, model, checkpoints, 10, resume=False)
    session.trainer.step(batch(), 0)
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    result = session.trainer.step(batch(), 1)
    if device == "cuda":
        torch.cuda.synchronize()
    print(
        f"trainer {device} parallel={parallel}: loss {result.loss:.6f} grad_norm "
        f"{result.grad_norm:.6f}, step {1000 * (time.perf_counter() - started):.0f} ms",
        flush=True,
    )
    return result


def fsdp_rank(rank: int, port: int, model: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=1)
    try:
        result = train(model, "cuda", "fsdp", f"{out}.ckpt")
        torch.save({"loss": result.loss, "grad_norm": result.grad_norm}, out)
    finally:
        dist.destroy_process_group()


def gaps(what: str, loss: tuple[float, float], grad_norm: tuple[float, float]) -> None:
    print(
        f"{what}: loss gap {abs(loss[0] - loss[1]):.2e}, grad norm gap "
        f"{abs(grad_norm[0] - grad_norm[1]):.2e}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--device", default="cuda" if cuda else "cpu", choices=["cuda", "cpu"])
    sizes_help = "comma-separated: tiny, small, smollm2-shape, qwen0.5b-shape"
    parser.add_argument("--sizes", help=sizes_help)
    parser.add_argument("--dtypes", help="comma-separated: float32, bfloat16")
    parser.add_argument("--prompts", type=int, help="prompts submitted at once")
    parser.add_argument("--prompt-tokens", type=int, help="tokens per prompt")
    parser.add_argument("--tokens", type=int, help="sampled tokens per prompt")
    parser.add_argument("--bandwidth-tbs", type=float, help="the GPU's memory bandwidth")
    args = parser.parse_args()
    on_gpu = args.device == "cuda"
    default_sizes = "smollm2-shape,qwen0.5b-shape" if on_gpu else "tiny"
    sizes = (args.sizes or default_sizes).split(",")
    dtypes = (args.dtypes or ("float32,bfloat16" if on_gpu else "float32")).split(",")
    n_prompts = args.prompts or (256 if on_gpu else 16)
    prompt_tokens = args.prompt_tokens or (128 if on_gpu else 16)
    tokens = args.tokens or (256 if on_gpu else 16)
    tbs = bandwidth_tbs(args.device, args.bandwidth_tbs)
    gpu_name = torch.cuda.get_device_name(0) if on_gpu else "no GPU: the engine part alone"
    print(torch.__version__, gpu_name, f"bandwidth {tbs} TB/s", flush=True)
    print(f"SDPA backends the engine allows on {args.device}: {backend_names(args.device)}")
    # Byte-tokenizer ids of unequal prompts, each `prompt_tokens` long.
    prompts = [
        list((f"question {i}: " + "why? " * (i % 7 + 1) * prompt_tokens).encode()[:prompt_tokens])
        for i in range(n_prompts)
    ]
    tmp = tempfile.mkdtemp()
    for size in sizes:
        model = f"{tmp}/{size}"
        print(f"-- {size} model: {make_model(model, size):,} parameters", flush=True)
        for name in dtypes:
            dtype = getattr(torch, name)
            run = lambda m=model, s=size, d=dtype: asyncio.run(  # noqa: E731
                engine_run(m, s, args.device, d, prompts, tokens, tbs)
            )
            part(f"engine {size} {name}", run)
    if not on_gpu:
        return
    model = f"{tmp}/tiny"
    if not Path(model).exists():
        init_model(model, size="tiny", seed=0)
    cpu = part("trainer cpu", lambda: train(model, "cpu", "none", f"{tmp}/cpu"))
    gpu = part("trainer cuda", lambda: train(model, "cuda", "none", f"{tmp}/cuda"))
    if cpu and gpu:
        gaps("trainer cuda vs cpu", (gpu.loss, cpu.loss), (gpu.grad_norm, cpu.grad_norm))
    out = f"{tmp}/fsdp.pt"
    spawn = lambda: mp.spawn(fsdp_rank, args=(free_port(), model, out), nprocs=1)  # noqa: E731
    part("trainer fsdp2, nccl, 1 GPU", spawn)
    if os.path.exists(out) and gpu:
        fsdp = torch.load(out)
        pairs = (fsdp["loss"], gpu.loss), (fsdp["grad_norm"], gpu.grad_norm)
        gaps("fsdp2 vs single-process cuda", *pairs)


if __name__ == "__main__":
    main()
