"""The built-in inference engine's memory under a soak's load, with weight versions read as rlbus
reads them (mapped: `map_safetensors`) against safetensors' own `load_file` (what rlbus did before
5897f98, which keeps Python heap for every tensor it reads).

Both run at once, each in a process of its own with the tiny model (`rlbus model init`): the
engine and its HTTP app on 127.0.0.1, a load process of its own sending --concurrency /v1/generate
calls (10-60 prompt tokens, 16-32 new, temperature 1), and a weight version loaded every
--version-every-s. Every --sample-s, after the freed heap is returned (bus/heap.py), its
anonymous RSS and glibc's heap in use and arena (mallinfo2) are sampled.

    python bench/engine_heap.py [--minutes 30] [--warmup-minutes 5] [--sample-s 30]

Last line: RESULT anon_growth_load_file_mb_per_h=<slope after the warm-up, load_file>
                  anon_growth_mapped_mb_per_h=<the same, mapped>
                  versions=<versions each loaded>
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

SERVE = r"""
import asyncio, json, subprocess, sys, time
from pathlib import Path
import torch, uvicorn
from safetensors.torch import load_file, save_file
from rlbus.bus import free_port
from rlbus.bus.heap import release_free_heap
from rlbus.consumers.inference import checkpoint_reader
from rlbus.consumers.inference.service import build_app, build_backend
from rlbus.consumers.model_size import read_header
from heap_figures import heap_mb  # bench/, on PYTHONPATH

def load_file_reader(path):  # the baseline: safetensors' own reader
    with open(path, "rb") as f:
        return read_header(f), load_file(path)

async def main(variant, model, work, minutes, every_s, sample_s, concurrency):
    torch.set_num_threads(1)
    if variant == "load_file":
        checkpoint_reader.map_safetensors = load_file_reader
    engine = build_backend(model)
    app = build_app(engine, model)
    from transformers import AutoModelForCausalLM
    weights = AutoModelForCausalLM.from_pretrained(model).state_dict()
    uris = []
    for i in range(2):
        path = work / f"v{i}.safetensors"
        save_file({k: (v + 0.001 * (i + 1)).contiguous() for k, v in weights.items()}, str(path))
        uris.append(str(path))
    del weights
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(port), str(concurrency)])
    try:
        async with engine:
            serving = asyncio.create_task(server.serve())
            start = time.monotonic()
            version, next_version, next_sample = 0, start + every_s, start
            while (now := time.monotonic()) - start < minutes * 60:
                if now >= next_version:
                    version += 1
                    await engine.load_weights(uris[version % 2], version)
                    next_version = now + every_s
                if now >= next_sample:
                    release_free_heap()
                    sample = {"minute": (now - start) / 60, **heap_mb(), "versions": version}
                    print("SAMPLE " + json.dumps(sample), flush=True)
                    next_sample = now + sample_s
                await asyncio.sleep(0.2)
            server.should_exit = True
            await serving
    finally:
        load.kill()

LOAD = r'''
import asyncio, random, sys, aiohttp
async def caller(session, rng, url):
    while True:
        body = {"prompt_ids": [rng.randrange(3, 250) for _ in range(rng.randrange(10, 60))],
                "sampling": {"temperature": 1.0, "max_tokens": rng.choice([16, 16, 32])}}
        try:
            async with session.post(url, json=body) as r:
                await r.read()
        except aiohttp.ClientError:
            await asyncio.sleep(1)
async def main(port, n):
    url = f"http://127.0.0.1:{port}/v1/generate"
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(caller(session, random.Random(i), url) for i in range(n)))
asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
'''

if __name__ == "__main__":
    a = sys.argv[1:]
    numbers = (float(a[3]), float(a[4]), float(a[5]), int(a[6]))
    asyncio.run(main(a[0], Path(a[1]), Path(a[2]), *numbers))
"""

VARIANTS = ("load_file", "mapped")


def slope_mb_per_h(samples: list[dict], key: str, warmup_minutes: float) -> float:
    late = [s for s in samples if s["minute"] >= warmup_minutes]
    if len(late) < 3:
        return float("nan")
    hours = [s["minute"] / 60 for s in late]
    return statistics.linear_regression(hours, [s[key] for s in late]).slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--warmup-minutes", type=float, default=5)
    parser.add_argument("--sample-s", type=float, default=30)
    parser.add_argument("--version-every-s", type=float, default=8)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    from rlbus.consumers.inference.model_init import init_model

    root = Path(tempfile.mkdtemp(prefix="rlbus-engine-heap-"))
    model = root / "tiny"
    init_model(model, seed=0)
    script = root / "serve.py"
    script.write_text(SERVE)
    console = Console()
    console.print(f"engine heap bench: {args.minutes:g} minutes a variant, both at once, in {root}")
    # The served process imports bench/heap_figures.py, as orchestrator_heap.py does.
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    env = os.environ | {"PYTHONPATH": path}
    runs = {}
    for variant in VARIANTS:
        work = root / variant
        work.mkdir()
        argv = [sys.executable, str(script), variant, str(model), str(work), str(args.minutes)]
        argv += [str(args.version_every_s), str(args.sample_s), str(args.concurrency)]
        runs[variant] = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    samples: dict[str, list[dict]] = {}
    for variant, process in runs.items():
        out, _ = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"the {variant} variant exited {process.returncode}")
        lines = [line[7:] for line in out.splitlines() if line.startswith("SAMPLE ")]
        samples[variant] = [json.loads(line) for line in lines]
    table = Table(title=f"MB per hour after minute {args.warmup_minutes:g}")
    for column in ("versions read by", "anonymous RSS", "glibc in use", "glibc arena", "versions"):
        table.add_column(column, justify="right")
    slopes = {}
    for variant, rows in samples.items():
        slopes[variant] = slope_mb_per_h(rows, "anon", args.warmup_minutes)
        in_use = slope_mb_per_h(rows, "in_use", args.warmup_minutes)
        arena = slope_mb_per_h(rows, "arena", args.warmup_minutes)
        table.add_row(
            variant,
            f"{slopes[variant]:+.1f}",
            f"{in_use:+.1f}",
            f"{arena:+.1f}",
            str(rows[-1]["versions"] if rows else 0),
        )
    console.print(table)
    versions = min(rows[-1]["versions"] for rows in samples.values() if rows)
    print(
        f"RESULT anon_growth_load_file_mb_per_h={slopes['load_file']:.1f} "
        f"anon_growth_mapped_mb_per_h={slopes['mapped']:.1f} versions={versions}"
    )


if __name__ == "__main__":
    main()
