"""Async vs sync RL under heavy-tailed rollout latency, and the trainer against a bare loop.

    python bench/async_rl.py [--steps 12] [--sigma 1.2]

Both modes run the same number of steps in this process's event loop on the embedded broker
(every role: env producer, judge, orchestrator, trainer, sink), with a scripted inference
server whose every call waits a delay drawn from a log-normal (agent tasks: most quick, a few
very slow). Wall time counts from the trainer's first announcement to its last step. Then the
trainer's step is timed against a bare torch loop (pad, forward, log-softmax, masked
policy-gradient loss, backward, clip, AdamW) on the async run's own batches from the store.

Last line: `RESULT async_speedup=<sync/async wall> trainer_vs_bare_torch=<tokens/s ratio>`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from rlbus.bus import Bus, Delivery, EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.config import load_settings
from rlbus.config.runs import RunConfig
from rlbus.config.trainer import TrainerConfig
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.trainer.batching import micro_batches
from rlbus.consumers.trainer.policy import load_policy
from rlbus.consumers.trainer.step import Trainer
from rlbus.launch import recipe
from rlbus.schemas import TrainBatch, WeightLoaded, WeightVersion, derived_id

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support
from support import ScriptedModel, ScriptedServer
from support.in_process import run_in_process

ROOT = Path(__file__).resolve().parent.parent
console = Console()
EXAMPLE = ROOT / "examples" / "reverse_text"


def lognormal_delay(median_s: float, sigma: float, seed: int):
    """Seconds per inference call drawn from exp(N(log median, sigma)): most quick, a few very
    slow."""
    rng = random.Random(seed)
    mu = np.log(median_s)
    return lambda: rng.lognormvariate(mu, sigma)


def half_right(seed: int):
    """Token script: the right answer half the time, a wrong one otherwise (groups carry signal)."""
    rng = random.Random(seed)

    def tokens(prompt_ids: list[int]) -> list[int]:
        answer = recipe.reverse_teacher(prompt_ids)
        return answer if rng.random() < 0.5 else [*answer[:-2][::-1], recipe.IM_END]

    return tokens


def acknowledge(scripted: ScriptedModel, run_id: str):
    """The scripted server 'loads' each WeightVersion at once: what the inference worker does."""

    async def role(bus: Bus, stop: asyncio.Event) -> None:
        async def on_batch(deliveries: list[Delivery]) -> None:
            for d in deliveries:
                if isinstance(d.event, WeightVersion) and d.event.run_id == run_id:
                    scripted.policy_version = max(scripted.policy_version, d.event.version)
                    await bus.publish(
                        WeightLoaded(
                            event_id=derived_id("scripted", run_id, d.event.version),
                            run_id=run_id,
                            version=d.event.version,
                            worker_id="scripted",
                        )
                    )

        group = f"scripted-{run_id}"
        await bus.subscriber("weights", group=group, batch=True)(on_batch).run(stop)

    return role


def run_mode(
    mode: str, workdir: Path, bootstrap: str, model: Path, args: argparse.Namespace
) -> dict:
    run_id = f"bench-{mode}"
    scripted = ScriptedModel(
        tokens=half_right(args.seed),
        model="scripted",
        record=False,
        delay_s=lognormal_delay(args.median_s, args.sigma, args.seed),
    )
    with ScriptedServer(scripted) as server:
        cfg = load_settings(
            EXAMPLE / "rl.toml",
            model=RunConfig,
            overrides={
                "run_id": run_id,
                "model": str(model),
                "max_steps": args.steps,
                "kafka": {
                    "bootstrap_servers": bootstrap,
                    "partitions": args.producers,
                    "topic_prefix": f"{run_id}.",
                },
                "store": {"url": f"chdb://{workdir / 'store'}"},
                "claim_check": {"url": str(workdir / "claims")},
                "inference": {"url": server.url + "/v1"},
                "orchestrator": {
                    "mode": mode,
                    "tasks_per_step": args.tasks_per_step,
                    "eval_every": 0,
                    "max_off_policy_steps": args.max_off_policy,
                    "max_inflight_tasks": args.tasks_per_step * (args.max_off_policy + 1),
                },
                "trainer": {"checkpoint_url": str(workdir / "ckpt" / run_id), "threads": 1},
                "envs": {
                    "reverse_text": {
                        "path": str(EXAMPLE / "env.toml"),
                        "producers": args.producers,
                        "overrides": {
                            "group_size": args.group_size,
                            "max_concurrent_rollouts": 512,
                        },
                    }
                },
            },
        )
        assert isinstance(cfg, RunConfig)
        asyncio.run(
            run_in_process(cfg, EXAMPLE, extra=[acknowledge(scripted, run_id)], timeout_s=1800)
        )
    with open_store(cfg.store.url, read_only=True) as store:
        p = {"r": run_id}
        start = store.query(
            "SELECT min(toUnixTimestamp64Micro(ts)) / 1e6 FROM weight_versions FINAL "
            "WHERE run_id = {r:String} AND version = 0",
            p,
        ).rows[0][0]
        steps = store.query(
            "SELECT max(toUnixTimestamp64Micro(ts)) / 1e6, median(tokens_per_s), "
            "groupArray(staleness) FROM train_steps FINAL WHERE run_id = {r:String}",
            p,
        ).rows[0]
        batches = store.read_events(TrainBatch, "run_id = {r:String}", parameters=p)
    behind = sorted({int(k) for histogram in steps[2] for k in histogram})
    return {
        "wall": steps[0] - start,
        "tokens_per_s": steps[1],
        "staleness": behind,
        "batches": batches,
    }


def bare_tokens_per_s(model: Path, batches: list[TrainBatch], budget: int) -> float:
    """A bare torch loop over the same batches: no loss registry, no metrics, no masks codes."""
    torch.manual_seed(0)
    policy = load_policy(model, TrainerConfig().lora)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-4)
    tokens, seconds = 0, 0.0
    for batch in batches:
        started = time.perf_counter()
        mbs = micro_batches(batch.samples, budget)
        total = max(1, sum(int((mb.loss_mask > 0).sum()) for mb in mbs))
        for mb in mbs:
            logits = policy(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1]
            logp = (
                torch.log_softmax(logits.float(), -1)
                .gather(-1, mb.input_ids[:, 1:, None])
                .squeeze(-1)
            )
            m = (mb.loss_mask[:, 1:] > 0).float()
            (-(mb.advantages[:, 1:] * logp * m).sum() / total).backward()
            tokens += mb.num_tokens
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds += time.perf_counter() - started
    return tokens / seconds


def engine_tokens_per_s(model: Path, batches: list[TrainBatch], cfg: TrainerConfig) -> float:
    torch.manual_seed(0)
    trainer = Trainer(load_policy(model, cfg.lora), cfg, len(batches))
    tokens, seconds = 0, 0.0
    for i, batch in enumerate(batches):
        result = trainer.step(batch.samples, i)
        tokens += result.input_tokens
        seconds += result.seconds
    return tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-off-policy", type=int, default=4)
    parser.add_argument(
        "--median-s", type=float, default=0.3, help="median scripted inference delay"
    )
    parser.add_argument("--sigma", type=float, default=1.2, help="log-normal sigma of the delay")
    parser.add_argument(
        "--producers", type=int, default=1, help="env producers (one per tasks partition)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlbus-async-"))
    model = workdir / "tiny"
    init_model(model, seed=0)
    torch.set_num_threads(1)
    results = {}
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        for mode in ("sync", "async"):
            results[mode] = run_mode(mode, workdir, broker.bootstrap_servers, model, args)
            console.print(f"{mode}: {results[mode]['wall']:.1f}s for {args.steps} steps")
    table = Table(
        "mode",
        "wall s",
        "trainer tokens/s (in run)",
        "staleness seen",
        title=(
            f"{args.steps} steps x {args.tasks_per_step} tasks x {args.group_size} rollouts; "
            f"inference delay "
            f"lognormal(median {args.median_s}s, sigma {args.sigma})"
        ),
    )
    for mode, r in results.items():
        table.add_row(mode, f"{r['wall']:.1f}", f"{r['tokens_per_s']:,.0f}", str(r["staleness"]))
    console.print(table)
    batches = [b for b in results["async"]["batches"] if b.samples]
    cfg = TrainerConfig(micro_batch_tokens=16384)  # the same micro-batches for both loops
    engine = engine_tokens_per_s(model, batches, cfg)
    bare = bare_tokens_per_s(model, batches, cfg.micro_batch_tokens)
    console.print(
        f"trainer step {engine:,.0f} tokens/s vs bare torch loop {bare:,.0f} tokens/s "
        f"on the async run's {len(batches)} batches"
    )
    print(
        f"RESULT async_speedup={results['sync']['wall'] / results['async']['wall']:.2f} "
        f"trainer_vs_bare_torch={engine / bare:.2f}"
    )


if __name__ == "__main__":
    main()
