"""The orchestrator's memory over a long run, alone in one process on the embedded broker: a
stand-in env producer answers every task with a scored group of whole traces (8 rollouts of
3-12 sampled tokens, the reverse_text soak's shape) and a stand-in trainer announces each batch's
version, so steps go as fast as the orchestrator batches them (examples/reverse_text/rl.toml's
orchestrator: 16 tasks a step, evaluations of 256 held-out tasks every 25 versions).

Run twice, each in a fresh process: with the freed C heap kept (glibc's default) and returned
every few seconds as the orchestrator role does (bus/heap.py `heap_returned`). Every 25 steps
the anonymous RSS and glibc's arena (mallinfo2) are sampled.

    python bench/orchestrator_heap.py [--steps 1000]

Last line: RESULT anon_growth_kept_mb=<anonymous RSS growth from step 100 to --steps, heap kept>
                  anon_growth_returned_mb=<the same, heap returned>
                  returned_vs_kept=<the second over the first>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import uuid
from contextlib import AsyncExitStack
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tests/support
from heap_figures import heap_mb
from support.factories import scored_group
from support.isolated import isolated_settings

from rlbus.bus import Bus, Delivery, EmbeddedBroker
from rlbus.bus.heap import heap_returned
from rlbus.config import load_settings
from rlbus.config.runs import RunConfig
from rlbus.consumers.orchestrator.build import build_orchestrator
from rlbus.consumers.orchestrator.orchestration import run_orchestrator
from rlbus.schemas import (
    Event,
    TaskPublished,
    TrainBatch,
    WeightLoaded,
    WeightVersion,
    group_id_of,
)

EXAMPLE = ROOT / "examples" / "reverse_text"
SAMPLE_EVERY = 25
FROM_STEP = 100
"""Growth is counted from here: the first steps fill the process's pools."""
console = Console()


def group_events(run_id: str, task: TaskPublished, version: int, rng: random.Random) -> list[Event]:
    members = range(task.group_size or 8)
    return scored_group(
        run_id,
        group_id_of(task),
        task.task_id,
        [list(range(rng.randint(3, 12))) for _ in members],
        [rng.random() for _ in members],
        env=task.env,
        info=dict(task.info),
        prompt=range(20),
        version=version,
    )


async def one_run(steps: int, returned: bool) -> list[dict[str, float]]:
    """The orchestrator for `steps` steps; a sample every SAMPLE_EVERY steps."""
    root = Path(tempfile.mkdtemp())
    samples: list[dict[str, float]] = []
    rng = random.Random(0)
    with EmbeddedBroker(log_path=root / "tansu.log") as broker:
        settings = isolated_settings(broker, root, run_id=f"heap-{uuid.uuid4().hex[:8]}")
        cfg = load_settings(
            overrides={
                **settings.model_dump(mode="json", exclude_none=True),
                "model": "unused (grpo needs no tokenizer)",
                "max_steps": steps + 1,
                "orchestrator": {
                    "mode": "async",
                    "tasks_per_step": 16,
                    "max_off_policy_steps": 2,
                    "drop_zero_signal": False,
                    "eval_every": 25,
                    "eval_tasks": 256,
                    "held_out_fraction": 0.05,
                },
                "envs": {
                    "reverse_text": {
                        "path": str(EXAMPLE / "env.toml"),
                        "overrides": {"group_size": 8},
                    }
                },
            },
            model=RunConfig,
        )
        run_id, version, stop = cfg.run_id, [0], asyncio.Event()
        async with AsyncExitStack() as stack:
            bus = await stack.enter_async_context(Bus.of(cfg))
            if returned:
                await stack.enter_async_context(heap_returned())

            def announce(v: int) -> list[Event]:
                return [
                    WeightVersion(version=v, uri="unused", run_id=run_id),
                    WeightLoaded(version=v, worker_id="stand-in", run_id=run_id),
                ]

            async def trainer(deliveries: list[Delivery]) -> None:
                for d in deliveries:
                    if isinstance(d.event, TrainBatch):
                        version[0] = d.event.step
                        await bus.publish_many(announce(d.event.step))
                        if d.event.step % SAMPLE_EVERY == 0:
                            samples.append({"step": d.event.step, **heap_mb()})
                        if d.event.step >= steps:
                            stop.set()

            async def env(deliveries: list[Delivery]) -> None:
                events = [
                    e
                    for d in deliveries
                    if isinstance(d.event, TaskPublished)
                    for e in group_events(run_id, d.event, version[0], rng)
                ]
                if events:
                    await bus.publish_many(events)

            await bus.publish_many(announce(0))
            orchestrator = build_orchestrator(bus, cfg, EXAMPLE)
            consumers = [
                bus.subscriber("batches", group="stand-in-trainer", batch=True, run=run_id)(
                    trainer
                ),
                bus.subscriber("tasks", group="stand-in-env", batch=True, run=run_id)(env),
            ]
            await asyncio.gather(
                run_orchestrator(bus, orchestrator, stop), *(c.run(stop) for c in consumers)
            )
    return samples


def growth(samples: list[dict[str, float]]) -> float:
    start = next(s for s in samples if s["step"] >= FROM_STEP)
    return samples[-1]["anon"] - start["anon"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--one", choices=["kept", "returned"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < FROM_STEP + SAMPLE_EVERY:
        parser.error(f"--steps must be at least {FROM_STEP + SAMPLE_EVERY}")
    if args.one:  # one measured run, in the fresh process the parent started
        print(json.dumps(asyncio.run(one_run(args.steps, args.one == "returned"))))
        return
    runs: dict[str, list[dict[str, float]]] = {}
    for way in ("kept", "returned"):
        with console.status(f"{args.steps} steps of the orchestrator, freed heap {way}"):
            out = subprocess.run(
                [sys.executable, __file__, "--steps", str(args.steps), "--one", way],
                capture_output=True,
                text=True,
                check=True,
            )
        runs[way] = json.loads(out.stdout.strip().splitlines()[-1])
    table = Table(title="orchestrator memory (MB) by step")
    table.add_column("step", justify="right")
    for way in runs:
        for figure in ("anon", "arena"):
            table.add_column(f"{figure}, heap {way}", justify="right")
    for kept, returned in zip(runs["kept"], runs["returned"], strict=False):
        if kept["step"] % 100 == 0:
            row = [f"{s[f]:.1f}" for s in (kept, returned) for f in ("anon", "arena")]
            table.add_row(str(int(kept["step"])), *row)
    console.print(table)
    kept_mb, returned_mb = growth(runs["kept"]), growth(runs["returned"])
    print(
        f"RESULT anon_growth_kept_mb={kept_mb:.1f} anon_growth_returned_mb={returned_mb:.1f} "
        f"returned_vs_kept={returned_mb / kept_mb if kept_mb > 0 else float('nan'):.3f}"
    )


if __name__ == "__main__":
    main()
