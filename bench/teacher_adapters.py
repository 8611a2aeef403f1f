"""Distillation teachers that are LoRA experts of one base: served as adapters of one built-in
engine (what `rlbus run` does now, consumers/inference/served_adapters.py) against one merged
model per teacher, each on a server of its own (what it did before), on SmolLM2-135M.

    python bench/teacher_adapters.py [--teachers 2] [--rank 8] [--requests 32] [--adapters F ...]

Each teacher is a LoRA weights file over SmolLM2 on every linear layer: `--adapters` names files a
LoRA run wrote (e.g. `rlbus-data/checkpoints/RUN/weights/v000018.safetensors`), else random ones
of `--rank` are made. Both ways serve the same teachers as `rlbus worker inference --frozen`
processes; for each: the resident memory of every server once it answers, the time to score
`--requests` completions per teacher (concurrent /v1/score calls, as the orchestrator makes
them), and the largest difference between the two ways' log-probs of the same tokens.

Last line: RESULT memory_vs_merged=<adapter server RSS / merged servers' RSS summed>
                  score_time_vs_merged=<adapter server's scoring time / merged servers'>
                  max_logprob_diff=<largest |difference| between the two ways' log-probs>
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tests/support
from support.bpe_model import smollm2_dir
from support.isolated import isolated_settings
from support.loras import lora_file

from rlbus.bus import EmbeddedBroker, free_port
from rlbus.clients.inference_client import InferenceClient
from rlbus.config import Settings
from rlbus.launch.processes import RoleProcess, rss_bytes

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
console = Console()


def merged_model(base: Path, uri: str, out: Path) -> Path:
    """`base` with the adapter at `uri` merged in, as a model directory (rlbus model export's
    way: the engine's own merge, then save_pretrained beside the base's tokenizer)."""
    from transformers import AutoModelForCausalLM

    from rlbus.consumers.inference.adapters import AdapterMerger
    from rlbus.consumers.inference.checkpoint_reader import read_checkpoint
    from rlbus.launch.model_export import copy_base_files

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        for param, tensor in AdapterMerger(model).pairs(read_checkpoint(uri).tensors, 1):
            param.copy_(tensor)
    out.mkdir(parents=True)
    copy_base_files(base, out)
    model.save_pretrained(out)
    return out


def serve(settings: Settings, model: Path, adapters: dict[str, str], logs: Path) -> tuple:
    """A frozen `rlbus worker inference` serving `model` (and `adapters`), once it answers."""
    port = free_port()
    args = ["--model", str(model), "--port", str(port), "--frozen", "--threads", "2"]
    for name, uri in adapters.items():
        args += ["--adapter", f"{name}={uri}"]
    server = RoleProcess("inference", settings, logs, args, name=f"inference-{port}")
    url = f"http://127.0.0.1:{port}/v1"
    while True:
        try:
            if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        if not server.alive():
            raise RuntimeError(f"inference exited:\n{server.log_tail()}")
        time.sleep(0.5)


def requests(n: int) -> list[tuple[list[int], list[int]]]:
    """`n` prompt/completion pairs of SmolLM2 ids, of several lengths."""
    return [
        (
            [1, 9690, 198] + [(97 * i + 13 * j) % 4000 + 100 for j in range(40 + i % 7)],
            [(31 * i + 7 * j) % 4000 + 100 for j in range(24)],
        )
        for i in range(n)
    ]


async def score_all(
    asked: list[tuple[str, str | None, list[int], list[int]]],
) -> tuple[float, list[list[float]]]:
    """Seconds to score every (url, model, prompt, completion) at once, and the log-probs."""
    clients = {url: InferenceClient(url) for url, *_ in asked}
    try:
        started = time.perf_counter()
        got = await asyncio.gather(
            *(clients[url].score(p, c, 1.0, model) for url, model, p, c in asked)
        )
        return time.perf_counter() - started, list(got)
    finally:
        for client in clients.values():
            await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teachers", type=int, default=2)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32, help="score requests per teacher")
    parser.add_argument("--adapters", nargs="*", default=[], help="LoRA weights files to serve")
    args = parser.parse_args()
    base = smollm2_dir()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        work = Path(tmp)
        settings = isolated_settings(broker, work)
        given = [Path(a).resolve().as_uri() for a in args.adapters]
        count = len(given) or args.teachers
        with console.status(f"{count} LoRA teachers and their merged models"):
            uris = given or [
                lora_file(base, work / f"lora{i}", i, LINEAR, args.rank, 0.02) for i in range(count)
            ]
            names = [f"teacher{i}" for i in range(count)]
            merged = [merged_model(base, uri, work / f"merged{i}") for i, uri in enumerate(uris)]
        pairs = requests(args.requests)
        servers: list[RoleProcess] = []
        try:
            with console.status("one server, the teachers as adapters"):
                shared, url = serve(settings, base, dict(zip(names, uris, strict=True)), work)
                servers.append(shared)
                shared_rss = rss_bytes(shared.proc.pid) or 0
                asked = [(url, n, p, c) for n in names for p, c in pairs]
                asyncio.run(score_all(asked[:count]))  # warm-up
                shared_s, shared_lp = asyncio.run(score_all(asked))
                shared.stop()
            with console.status(f"{count} servers, a merged model each"):
                alone = [serve(settings, m, {}, work) for m in merged]
                servers += [s for s, _ in alone]
                alone_rss = [rss_bytes(s.proc.pid) or 0 for s, _ in alone]
                asked = [(u, None, p, c) for _, u in alone for p, c in pairs]
                asyncio.run(score_all(asked[:: len(pairs)]))  # warm-up
                alone_s, alone_lp = asyncio.run(score_all(asked))
        finally:
            for server in servers:
                if server.alive():
                    server.stop()
    pairs_of = zip(shared_lp, alone_lp, strict=True)
    diff = max(abs(a - b) for x, y in pairs_of for a, b in zip(x, y, strict=True))
    table = Table(title=f"{count} LoRA teachers of SmolLM2-135M, {args.requests} scores each")
    for column in ("served as", "servers", "resident memory", f"{len(shared_lp)} scores"):
        table.add_column(column, justify="left" if column == "served as" else "right")
    table.add_row(
        "adapters of one engine", "1", f"{shared_rss / 2**20:,.0f} MiB", f"{shared_s:.2f} s"
    )
    table.add_row(
        "a merged model each", str(count), f"{sum(alone_rss) / 2**20:,.0f} MiB", f"{alone_s:.2f} s"
    )
    console.print(table)
    console.print(
        f"RESULT memory_vs_merged={shared_rss / sum(alone_rss):.3f} "
        f"score_time_vs_merged={shared_s / alone_s:.3f} max_logprob_diff={diff:.2e}"
    )


if __name__ == "__main__":
    main()
