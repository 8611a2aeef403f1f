"""rlbus's built-in engine and trainer on a CUDA GPU, and the FSDP2 trainer under nccl: the
check a session runs when it is lent a GPU (the device tool; this machine has none).

    python bench/gpu.py

Engine: 128 prompts x 64 sampled tokens on the tiny and the small model, fp32 and bf16:
tokens/s, and the worst gap between the engine's per-token log-probs and a plain unbatched
forward on the same GPU. Trainer: one step after a warm-up on the CPU, on the GPU, and as FSDP2
on one GPU under nccl (loss and grad norm against the single-process GPU trainer's). A part
that fails prints its traceback and the others still run.

On a machine with no package registry, carry what its image lacks as wheels (the device
README); `pip install --no-deps --no-build-isolation -e .` then installs rlbus.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlbus.bus import free_port
from rlbus.clients.token_api import SamplingParams
from rlbus.config.trainer import TrainerConfig
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.trainer.session import open_session
from rlbus.consumers.trainer.step import StepResult
from rlbus.schemas import TrainSample, masks
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens

PROMPTS, TOKENS, CHECKED = 128, 64, 16


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


async def engine_run(model: str, dtype: torch.dtype) -> None:
    engine = Engine.from_pretrained(model, device="cuda", dtype=dtype)
    async with engine:
        tokenizer = engine.tokenizer
        prompts = [
            tokenizer.encode(f"question {i}: " + "why? " * (i % 7), add_special_tokens=False)
            for i in range(PROMPTS)
        ]
        params = SamplingParams(max_tokens=TOKENS, ignore_eos=True, seed=1)
        await asyncio.gather(*(engine.generate(p, params) for p in prompts[:8]))  # warm-up
        torch.cuda.synchronize()
        started = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        worst = 0.0
        for prompt, result in zip(prompts[:CHECKED], results[:CHECKED], strict=True):
            ids = torch.tensor([prompt + result.completion_ids], device="cuda")
            with torch.inference_mode():
                logits = engine.model(ids).logits[0].float()
            chosen = torch.tensor(result.completion_ids, device="cuda")[:, None]
            plain = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(-1, chosen)
            gap = (plain.squeeze(-1).cpu() - torch.tensor(result.logprobs)).abs().max()
            worst = max(worst, gap.item())
    tokens = sum(len(r.completion_ids) for r in results)
    print(
        f"engine {dtype}: {tokens / seconds:,.0f} tokens/s ({seconds:.2f}s); worst "
        f"|log-prob - plain forward| over {CHECKED} completions {worst:.2e}",
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
    print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
    tmp = tempfile.mkdtemp()
    for size in ("tiny", "small"):
        model = f"{tmp}/{size}"
        print(f"-- {size} model: {init_model(model, size=size, seed=0):,} parameters", flush=True)
        for dtype in (torch.float32, torch.bfloat16):
            part(f"engine {size} {dtype}", lambda m=model, d=dtype: asyncio.run(engine_run(m, d)))
    model = f"{tmp}/tiny"
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
