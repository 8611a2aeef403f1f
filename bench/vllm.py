"""rlbus serving through vLLM against vLLM's own offline `generate`, against rlbus's built-in
engine, the weight update's share of a training step, and vLLM's start-up time, on one model,
the same prompts and this machine.

    python bench/vllm.py [--model DIR] [--batch 32] [--max-tokens 32] [--repeats 3] [--versions 6]

Needs vLLM's environment (`rlbus engine install vllm`). Parts, one after another:

1. offline: vLLM's `LLM.generate` in that environment, the `--batch` prompts at once (after a
   warm-up), EOS ignored, `--max-tokens` each: tokens/s, the median of `--repeats` batches.
2. served: `rlbus worker inference --backend vllm` as `rlbus run` starts it (engine settings at
   their defaults but for max_model_len), the same prompts as concurrent /v1/generate calls:
   tokens/s (the median of `--repeats` batches, as offline), and start-up (process start to
   serving). Then `--versions` weight versions as
   the trainer writes them (part 3's file) published on the bus one after another, and the
   time from each until a request is answered by it.
3. trainer: one optimizer step of the trainer on `--batch` samples (bench/real_model.py's
   trainer part), which writes the version part 2 loads.
4. built-in: the same calls served by `rlbus worker inference --backend hf` (median of
   `--repeats`).

Last line: RESULT served_vs_offline=<served tok/s / offline tok/s>
                  vllm_vs_builtin=<served vLLM tok/s / served built-in tok/s>
                  weight_update_share=<(write + publish-to-served) / trainer step>, publish-to-
                      served the median of versions after the first
                  startup_s=<vLLM's start-up, seconds>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tests/support
from real_model import chat_prompts, parts_of
from support.bpe_model import smollm2_dir, smollm2_tokenizer
from support.isolated import isolated_settings

from rlbus.bus import Bus, EmbeddedBroker, free_port
from rlbus.config import Settings
from rlbus.config.runs import VLLMConfig
from rlbus.consumers.inference.vllm_backend import (
    available_memory,
    engine_environ,
    engine_settings,
)
from rlbus.launch.engines import engine_python
from rlbus.launch.processes import RoleProcess
from rlbus.schemas import WeightVersion

MAX_MODEL_LEN = 512
OFFLINE = """
import json, sys, time
from vllm import LLM, SamplingParams

def main():
    model, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=int(sys.argv[4]),
              seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(inputs, params, use_tqdm=False)
    for _ in range(int(sys.argv[5])):
        started = time.perf_counter()
        out = llm.generate(inputs, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        tokens = sum(len(o.outputs[0].token_ids) for o in out)
        print("PART " + json.dumps({"tokens": tokens, "seconds": seconds}), flush=True)

if __name__ == "__main__":
    main()
"""


def offline(model: Path, batch: list[list[int]], max_tokens: int, repeats: int) -> list[float]:
    script = Path(tempfile.mkdtemp()) / "offline.py"
    script.write_text(OFFLINE)
    argv = [engine_python(), str(script), str(model), json.dumps(batch), str(max_tokens)]
    # The KV cache the served engine gets: vLLM's own CPU default takes 92 % of the machine's
    # memory, and its worker was killed for it on an idle 24 GB machine.
    env = engine_environ(
        engine_settings(VLLMConfig(), "cpu", MAX_MODEL_LEN, available_memory())[1], os.environ
    )
    argv += [str(MAX_MODEL_LEN), str(repeats)]
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=env)
    parts = parts_of(done.stdout)
    if done.returncode != 0 or len(parts) != repeats:
        raise RuntimeError(f"vLLM's offline generate exited {done.returncode}")
    return [part["tokens"] / part["seconds"] for part in parts]


async def generate(client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int) -> dict:
    sampling = {"max_tokens": max_tokens, "temperature": 1.0, "ignore_eos": True}
    response = await client.post(
        f"{url}/generate", json={"prompt_ids": prompt, "sampling": sampling}, timeout=600
    )
    response.raise_for_status()
    return response.json()


async def served_rates(
    url: str, batch: list[list[int]], max_tokens: int, repeats: int
) -> list[float]:
    """Tokens/s of `repeats` batches of concurrent calls, after a warm-up batch."""
    async with httpx.AsyncClient() as client:

        async def one_batch() -> float:
            started = time.perf_counter()
            results = await asyncio.gather(*(generate(client, url, p, max_tokens) for p in batch))
            return sum(len(r["completion_ids"]) for r in results) / (time.perf_counter() - started)

        await one_batch()
        return [await one_batch() for _ in range(repeats)]


def serve(
    settings: Settings, model: Path, backend: str, logs: Path
) -> tuple[RoleProcess, str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    args = ["--model", str(model), "--port", str(port), "--backend", backend, "--threads", "2"]
    args += ["--inference.vllm.max-model-len", str(MAX_MODEL_LEN)]
    started = time.perf_counter()
    server = RoleProcess("inference", settings, logs, args, name=f"inference-{backend}")
    while True:
        try:
            if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                return server, url, time.perf_counter() - started
        except httpx.HTTPError:
            pass
        if not server.alive():
            raise RuntimeError(f"{backend} inference exited:\n{server.log_tail()}")
        time.sleep(0.5)


async def update_seconds(
    settings: Settings, url: str, uri: str, prompt: list[int], versions: int
) -> list[float]:
    """Publish versions 1..`versions`, each at `uri` (the same file: the engine's work is a
    version's, whatever it holds); seconds from each publish until a request is answered by it."""
    seconds = []
    async with Bus.of(settings) as bus, httpx.AsyncClient() as client:
        for version in range(1, versions + 1):
            started = time.perf_counter()
            await bus.publish(WeightVersion(version=version, step=version, uri=uri))
            while (await generate(client, url, prompt, 1))["policy_version"] != version:
                await asyncio.sleep(0.01)
            seconds.append(time.perf_counter() - started)
    return seconds


def trainer_step(model: Path, batch: int, max_tokens: int, workdir: Path) -> dict:
    command = [sys.executable, str(ROOT / "bench" / "real_model.py"), "--part", "trainer"]
    command += [f"--model={model}", f"--batch={batch}", f"--max-tokens={max_tokens}"]
    command += [f"--workdir={workdir}", "--trials=1", "--micro-batch-tokens=1024"]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    parts = parts_of(done.stdout)
    if done.returncode != 0 or not parts:
        raise RuntimeError(f"the trainer part exited {done.returncode}")
    return parts[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="Hugging Face model directory (SmolLM2)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed batches per engine (their median counts)"
    )
    parser.add_argument(
        "--versions", type=int, default=6, help="weight versions published, one after another"
    )
    args = parser.parse_args()
    model = args.model or smollm2_dir()
    batch = chat_prompts(smollm2_tokenizer(), args.batch)  # bench/real_model.py's
    with tempfile.TemporaryDirectory(prefix="rlbus-vllm-") as work, EmbeddedBroker() as broker:
        root = Path(work)
        settings = isolated_settings(broker, root, run_id="bench-vllm")
        print("offline vLLM ...", file=sys.stderr, flush=True)
        offline_rates = offline(model, batch, args.max_tokens, args.repeats)
        print("trainer step ...", file=sys.stderr, flush=True)
        train = trainer_step(model, args.batch, args.max_tokens, root / "ckpt")
        print("served vLLM ...", file=sys.stderr, flush=True)
        server, url, startup = serve(settings, model, "vllm", root / "logs")
        try:
            vllm_rates = asyncio.run(served_rates(url, batch, args.max_tokens, args.repeats))
            updates = asyncio.run(
                update_seconds(settings, url, train["weights_uri"], batch[0], args.versions)
            )
        finally:
            server.stop()
        print("served built-in ...", file=sys.stderr, flush=True)
        server, url, builtin_startup = serve(settings, model, "hf", root / "logs")
        try:
            builtin_rates = asyncio.run(served_rates(url, batch, args.max_tokens, args.repeats))
        finally:
            server.stop()
    # A run loads a version every step: the share is a running engine's, the median after the
    # first (which also grows the engine's heap to what a version needs; printed apart).
    update = statistics.median(updates[1:]) if len(updates) > 1 else updates[0]
    share = (train["write_s"] + update) / train["trainer_s"] if train.get("write_s") else math.nan
    offline_rate, vllm_rate, builtin_rate = (
        statistics.median(rates) for rates in (offline_rates, vllm_rates, builtin_rates)
    )

    def each(rates: list[float]) -> str:
        return ", ".join(f"{rate:.0f}" for rate in rates)

    print(f"model {model}, {args.batch} prompts x {args.max_tokens} new tokens (EOS ignored)")
    print(f"vLLM offline generate   {offline_rate:8.1f} tokens/s  (each: {each(offline_rates)})")
    print(
        f"vLLM served by rlbus    {vllm_rate:8.1f} tokens/s  (each: {each(vllm_rates)}; "
        f"start-up {startup:.1f} s)"
    )
    print(
        f"built-in served         {builtin_rate:8.1f} tokens/s  (each: {each(builtin_rates)}; "
        f"start-up {builtin_startup:.1f} s)"
    )
    print(
        f"trainer step {train['trainer_s']:.2f} s; version written in {train['write_s']:.2f} s "
        f"({train['weights_mb']:.0f} MiB), publish to served {update:.2f} s "
        f"(median of versions 2-{len(updates)}; each: {', '.join(f'{u:.2f}' for u in updates)})"
    )
    print(
        f"RESULT served_vs_offline={vllm_rate / offline_rate:.3f} "
        f"vllm_vs_builtin={vllm_rate / builtin_rate:.3f} weight_update_share={share:.3f} "
        f"startup_s={startup:.1f}"
    )


if __name__ == "__main__":
    main()
