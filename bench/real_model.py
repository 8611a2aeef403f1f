"""The built-in engine and the trainer on a real pretrained model, each against a bare torch
baseline measured in the same run, the weight update's share of a step, and peak memory.

    python bench/real_model.py [--model DIR] [--batch 32] [--max-tokens 32]
        [--micro-batch-tokens 1024] [--device cpu|cuda] [--dtype float32|bfloat16] [--trials 1]
        [--lora]

Three parts, each in a subprocess of its own so that its peak RSS (ru_maxrss) is its own:

1. trainer: one optimizer step of `Trainer.step` (consumers/trainer/step.py) on a batch of
   `--batch` samples (a chat prompt + `--max-tokens` completion tokens under the policy mask,
   advantages +-1) against a bare torch step on the same batch (the same micro-batches, forward,
   log-softmax, masked policy-gradient loss, backward, clip, AdamW) on the same model; trials
   alternate after one warm-up step of each (AdamW allocates its state there). Then the step's
   weights are published as the trainer publishes them: `published_weights` (full weights, or
   under `--lora` the adapters alone) + `CheckpointStore.write_weights` (the file a
   WeightVersion points at).
2. inference: `Engine.load_weights` of the trainer's file and one request on the new version,
   twice (versions 1 and 2 of the same file): write + load + first token of the second is the
   weight update of every version after a worker's first, and `weight_update_share` = that /
   the trainer's step time; the first is printed too. Then `Engine.generate`
   (consumers/inference/engine.py, what the server runs) on the same `--batch` chat prompts,
   all submitted at once, against one left-padded `model.generate` call of the model as
   transformers loads it (a copy of its own: the engine repacks its linear layers):
   temperature 1, no top-k/top-p, EOS ignored, `--max-tokens` each; alternating trials after a
   warm-up of each.

Last line: RESULT engine_vs_generate=<engine tok/s / generate tok/s>
                  trainer_vs_bare=<trainer tok/s / bare step tok/s>
                  weight_update_share=<(write + load + first token) / trainer step seconds>
(nan where a part failed; the reason is printed above it.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from timed_generate import bare_generate, engine_generate, stock_model, synchronize

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / "out" / "models" / "smollm2"
TOPICS = ["rivers", "prime numbers", "sorting", "tea", "chess", "volcanoes", "compilers", "bees"]


def default_model() -> Path:
    """SmolLM2 imported into bench/out by `rlbus model import`, where that command exists."""
    if CACHE.exists():
        return CACHE
    rlbus = shutil.which("rlbus") or str(Path(sys.executable).with_name("rlbus"))
    listed = subprocess.run([rlbus, "model", "--help"], capture_output=True, text=True).stdout
    if " import " not in listed:
        raise SystemExit(
            "--model is required: this rlbus has no `rlbus model import` to fetch SmolLM2 with "
            "(e.g. --model /work/cache/smollm2)"
        )
    subprocess.run([rlbus, "model", "import", "smollm2", str(CACHE)], check=True)
    return CACHE


def peak_memory(device: str) -> dict[str, float]:
    import torch

    # Linux reports ru_maxrss in KiB.
    out = {"rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if device.startswith("cuda"):
        out["gpu_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def chat_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    from rlbus.clients.renderer import TemplateRenderer

    renderer = TemplateRenderer(tokenizer)
    return [
        renderer.render(
            [
                {
                    "role": "user",
                    "content": f"Tell me about {TOPICS[i % 8]} ({i})." + " Please." * (i % 4),
                }
            ]
        )
        for i in range(n)
    ]


# ---- trainer part ----------------------------------------------------------------------------


def train_batch(tokenizer: Any, args: argparse.Namespace) -> list:
    """`--batch` samples: a chat prompt and `--max-tokens` random completion ids under the policy
    mask, advantage +1 or -1 (a group's spread), inference log-probs of -2."""
    import numpy as np

    from rlbus.schemas import TrainSample, masks
    from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens

    rng = random.Random(0)
    samples = []
    for i, prompt in enumerate(chat_prompts(tokenizer, args.batch)):
        completion = [rng.randrange(len(tokenizer)) for _ in range(args.max_tokens)]
        m = np.array([0] * len(prompt) + [masks.POLICY] * len(completion), dtype=np.uint8)
        samples.append(
            TrainSample(
                rollout_id=f"r{i}",
                input_ids=pack_tokens(prompt + completion),
                loss_mask=pack_mask(m),
                advantages=pack_logprobs((m > 0) * (1.0 if i % 2 else -1.0)),
                inference_logprobs=pack_logprobs((m > 0) * -2.0),
                policy_version=0,
                temperature=1.0,
            )
        )
    return samples


def bare_step(model: Any, optimizer: Any, samples: list, budget: int, device: str) -> float:
    """Seconds of a bare torch step over the same micro-batches: no loss registry, no metrics."""
    import torch

    from rlbus.consumers.trainer.batching import micro_batches

    synchronize(device)
    started = time.perf_counter()
    mbs = micro_batches(samples, budget)
    total = max(1, sum(int((mb.loss_mask > 0).sum()) for mb in mbs))
    for mb in mbs:
        ids = mb.input_ids.to(device)
        logits = model(input_ids=ids, attention_mask=mb.attention_mask.to(device)).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        m = (mb.loss_mask[:, 1:] > 0).float().to(device)
        (-(mb.advantages[:, 1:].to(device) * logp * m).sum() / total).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return time.perf_counter() - started


def trainer_part(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from rlbus.config.trainer import TrainerConfig
    from rlbus.consumers.trainer.batching import micro_batches
    from rlbus.consumers.trainer.checkpoint import CheckpointStore
    from rlbus.consumers.trainer.policy import load_policy, published_kind, published_weights
    from rlbus.consumers.trainer.session import WEIGHTS_DTYPES
    from rlbus.consumers.trainer.step import Trainer

    torch.manual_seed(0)
    cfg = TrainerConfig(
        micro_batch_tokens=args.micro_batch_tokens,
        device=args.device,
        optim={"lr": 1e-6},  # a pretrained model's learning rate; timing does not depend on it
        lora={"enabled": args.lora},
    )
    # load_policy loads fp32; --dtype casts both sides' weights alike.
    model = load_policy(args.model, cfg.lora, device=args.device).to(getattr(torch, args.dtype))
    samples = train_batch(AutoTokenizer.from_pretrained(args.model), args)
    tokens = sum(mb.num_tokens for mb in micro_batches(samples, args.micro_batch_tokens))
    trainer = Trainer(model, cfg, total_steps=args.trials + 1)
    bare_opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    def trainer_step() -> float:
        synchronize(args.device)
        started = time.perf_counter()
        trainer.step(samples, 0)
        synchronize(args.device)
        return time.perf_counter() - started

    trainer_step(), bare_step(model, bare_opt, samples, args.micro_batch_tokens, args.device)
    trainer_s, bare_s = [], []
    for _ in range(args.trials):
        trainer_s.append(trainer_step())
        bare_s.append(bare_step(model, bare_opt, samples, args.micro_batch_tokens, args.device))
    out: dict[str, Any] = {
        "tokens": tokens,
        "trainer_s": min(trainer_s),
        "bare_s": min(bare_s),
        "micro_batches": len(micro_batches(samples, args.micro_batch_tokens)),
    }
    started = time.perf_counter()
    try:
        # As the trainer publishes: in trainer.weights_dtype (its default), a tied head once;
        # under LoRA the adapters alone.
        kind = published_kind(cfg.lora)
        store = CheckpointStore(
            args.workdir, weights_dtype=WEIGHTS_DTYPES[cfg.weights_dtype], weights_kind=kind
        )
        written = store.write_weights(1, published_weights(model, kind))
        out["write_s"] = time.perf_counter() - started
        out["weights_uri"], out["weights_mb"] = written.uri, written.bytes / 2**20
    except Exception as exc:  # reported as the reason weight_update_share is nan
        out["write_error"] = f"{type(exc).__name__}: {exc}"
    return out | peak_memory(args.device)


# ---- inference part --------------------------------------------------------------------------


async def first_token_on(engine: Any, prompt: list[int], version: int) -> None:
    from rlbus.clients.token_api import SamplingParams

    result = await engine.generate(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    if result.policy_version != version:
        raise RuntimeError(f"served version {result.policy_version}, expected {version}")


async def inference_async(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rlbus.consumers.inference.engine import Engine

    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    async with Engine.from_pretrained(args.model, device=args.device, dtype=dtype) as engine:
        prompts = chat_prompts(engine.tokenizer, args.batch)
        await engine_generate(engine, prompts, args.max_tokens)
        out: dict[str, Any] = {"tokens": args.batch * args.max_tokens}
        if args.weights:
            # The first load of a worker also pays once for its weights' pages (mapped from
            # the model file) and, under LoRA, for its copy of the base; each later version, as
            # in a run, pays only the update itself.
            for version in (1, 2):
                started = time.perf_counter()
                out["load_s"] = await engine.load_weights(args.weights, version)
                await first_token_on(engine, prompts[0], version)
                out["load_first_token_s"] = time.perf_counter() - started
                out.setdefault("first_load_first_token_s", out["load_first_token_s"])
        out |= peak_memory(args.device)  # the engine's, before the baseline's copy is loaded
        baseline = stock_model(args.model, args.device, dtype)
        bare_generate(baseline, engine.tokenizer, prompts, args.max_tokens)
        engine_s, generate_s = [], []
        for _ in range(args.trials):
            engine_s.append(await engine_generate(engine, prompts, args.max_tokens))
            generate_s.append(bare_generate(baseline, engine.tokenizer, prompts, args.max_tokens))
        out |= {
            "engine_s": min(engine_s),
            "generate_s": min(generate_s),
            "mean_batch": engine.stats().mean_batch_size,
        }
    return out


# ---- driver ----------------------------------------------------------------------------------


def parts_of(stdout: str) -> list[dict[str, Any]]:
    """The results a part's process printed, one `PART <json>` line each."""
    return [json.loads(line[5:]) for line in stdout.splitlines() if line.startswith("PART ")]


def run_part(part: str, args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    command = [sys.executable, __file__, "--part", part, *args.forward, *extra]
    print(f"{part} part ...", file=sys.stderr, flush=True)
    # Its stderr (warnings, a traceback) goes straight to ours.
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    parts = parts_of(done.stdout)
    if done.returncode != 0 or not parts:
        return {"error": f"{part} part exited {done.returncode} (its stderr is above)"}
    return parts[-1]


def ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else math.nan


def report(model: Path, args: argparse.Namespace, train: dict, infer: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    console.print(
        f"{model}: {args.device}, {args.dtype}, batch {args.batch} x {args.max_tokens} new tokens, "
        f"micro_batch_tokens {args.micro_batch_tokens}, best of {args.trials} alternating "
        f"trial(s) after a warm-up; each part in its own process"
    )
    for part in (train, infer):
        if "error" in part:
            console.print(f"[red]{part['error']}[/red]")
    table = Table("part", "rlbus tok/s", "baseline", "baseline tok/s", "ratio", "peak RSS GB")
    engine_ratio = trainer_ratio = math.nan
    if "engine_s" in infer:
        e, g = infer["tokens"] / infer["engine_s"], infer["tokens"] / infer["generate_s"]
        engine_ratio = e / g
        table.add_row(
            "inference (Engine.generate)",
            f"{e:,.1f}",
            "model.generate",
            f"{g:,.1f}",
            f"{engine_ratio:.2f}",
            f"{infer['rss_gb']:.2f}",
        )
    if "trainer_s" in train:
        t, b = train["tokens"] / train["trainer_s"], train["tokens"] / train["bare_s"]
        trainer_ratio = t / b
        table.add_row(
            f"trainer (Trainer.step, {train['micro_batches']} micro-batches)",
            f"{t:,.1f}",
            "torch fwd+bwd+AdamW",
            f"{b:,.1f}",
            f"{trainer_ratio:.2f}",
            f"{train['rss_gb']:.2f}",
        )
    console.print(table)
    for name, part in (("trainer", train), ("inference", infer)):
        if "gpu_gb" in part:
            console.print(f"{name}: peak GPU memory allocated {part['gpu_gb']:.2f} GB")
    share = math.nan
    if "write_error" in train:
        console.print(f"[red]publishing the weights failed: {train['write_error']}[/red]")
    elif "load_first_token_s" in infer:
        update = train["write_s"] + infer["load_first_token_s"]
        share = update / train["trainer_s"]
        console.print(
            f"weight update: write {train['write_s']:.2f} s ({train['weights_mb']:.0f} MB) + "
            f"load {infer['load_s']:.2f} s + first token on it "
            f"{infer['load_first_token_s'] - infer['load_s']:.2f} s = {update:.2f} s; "
            f"trainer step {train['trainer_s']:.2f} s (a worker's first version: load + first "
            f"token {infer['first_load_first_token_s']:.2f} s)"
        )
    if "mean_batch" in infer:
        console.print(f"engine mean decode batch: {infer['mean_batch']:.1f}")
    print(
        f"RESULT engine_vs_generate={engine_ratio:.3f} trainer_vs_bare={trainer_ratio:.3f} "
        f"weight_update_share={share:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="Hugging Face model directory")
    parser.add_argument("--batch", type=int, default=32, help="prompts / samples per batch")
    parser.add_argument("--max-tokens", type=int, default=32, help="new tokens per sequence")
    parser.add_argument("--micro-batch-tokens", type=int, default=1024)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--trials", type=int, default=1, help="timed trials after the warm-up")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument(
        "--lora", action="store_true", help="train LoRA adapters; versions carry them alone"
    )
    parser.add_argument("--part", choices=["trainer", "inference"], help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        if args.part == "trainer":
            result = trainer_part(args)
        else:
            result = asyncio.run(inference_async(args))
        print("PART " + json.dumps(result))
        return
    model = args.model or default_model()
    args.forward = [
        f"--model={model}",
        f"--batch={args.batch}",
        f"--max-tokens={args.max_tokens}",
        f"--micro-batch-tokens={args.micro_batch_tokens}",
        f"--device={args.device}",
        f"--dtype={args.dtype}",
        f"--trials={args.trials}",
        f"--threads={args.threads}",
        *(["--lora"] if args.lora else []),
    ]
    with tempfile.TemporaryDirectory(prefix="rlbus-real-") as workdir:
        train = run_part("trainer", args, [f"--workdir={workdir}"])
        weights = [f"--weights={train['weights_uri']}"] if "weights_uri" in train else []
        infer = run_part("inference", args, weights)
    report(model, args, train, infer)


if __name__ == "__main__":
    main()
