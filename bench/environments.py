"""A verifiers V1 task set hosted in a venv of its own, through rlbus, next to verifiers' own
`vf-eval`; and the worker protocol's cost next to the same adapter run in-process.

    python bench/environments.py [--tasks 200] [--concurrency 32]

`verifiers:reverse_text` (examples/verifiers_v1/reverse_text, installed by rlbus's installer
into bench/out/envs the first time: verifiers 0.4 from the registry), its bundled one-turn
harness in V1's `subprocess` runtime (the adapter's default), on the same first N tasks, the
same scripted server (a child process: its CPU counts for no side) and the same concurrency:

1. verifiers' own `vf-eval` in the venv (`-n N -r 1 -c C`): rollouts/s from its first
   rollout's start to its last score (its traces' timing fields), CPU per rollout of its
   process tree over that window (sampled);
2. `rlbus eval verifiers:reverse_text` (the embedded broker, a sink storing into chdb):
   rollouts/s from its first rollout until its last score is in ClickHouse, CPU per rollout
   of this process, the worker's process tree, the broker and the sink over the eval; once
   in V1's episode mode (the worker plays each rollout with V1's harness and runtime), once in
   mode "steps" (rlbus's chat loop asks, the worker scores the answer with the task set's own
   rewards, offline);
3. the V1 adapter (environment/hosted/adapters/verifiers_v1.py) driven in-process by a small
   script the venv's python runs (the adapter module loaded as host.py loads it), N rollouts
   at concurrency C straight against the scripted server; next to the same N rollouts sent
   from this process through `HostedWorker.acall("rollout", ...)` (host.py in the venv, JSON
   lines over its pipes) to the same server. Both sides do the same V1 work; they differ by
   the protocol only. Beside them, not in the RESULT: the in-process driver again with a base
   URL of its own for each rollout, as rlbus's interception server gives each (what that
   costs V1 by itself).

Each side first warms up on a few tasks. Last line:
RESULT rlbus_vs_v1_eval=<rollouts/s ratio> cpu_per_rollout_vs_v1_eval=<CPU ratio>
       worker_vs_in_process=<rollouts/s ratio> steps_vs_v1_eval=<rollouts/s ratio>
       steps_cpu_per_rollout_vs_v1_eval=<CPU ratio>
(rlbus_ and cpu_: episode mode; steps_: mode "steps")
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlbus.config import Settings, load_settings
from rlbus.discovery import local_broker
from rlbus.environment import Environment, load_environment
from rlbus.environment.hosted.venvs import (
    install_env,
    passed_environment,
    read_record,
    venv_python,
)
from rlbus.environment.hosted.worker import HOST, HostedWorker, WorkerSpec
from rlbus.launch.eval import run_eval
from rlbus.launch.local_sink import local_sink

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tests/support
from support import CpuMeter, TreeCpuSampler, own_cpu, serve_in_child, tree_cpu

OUT = ROOT / "bench" / "out"
ENVS = OUT / "envs"
"""Where rlbus's installer puts the example's venv for this bench (RLBUS_ENVS_DIR)."""
EXAMPLE = ROOT / "examples" / "verifiers_v1" / "reverse_text"
TARGET = "reverse_text"
RUNS = OUT / "environments"
"""vf-eval's run directories and logs, the in-process driver and its results."""
WARM_UP = 8
MODEL = "scripted"
REWARD = 1.5
"""Each rollout's reward when the answer is right: exact (weight 1) + partial (weight 0.5)."""

SERVE = """
import sys
from rlbus.schemas.chat import text_of
from rlbus.launch.scripted_model import ScriptedModel, serve_scripted

def chat(messages, tools):
    # The last user message's last word, reversed: every answer right.
    user = next(m for m in reversed(messages) if m.get("role") == "user")
    return {"content": text_of(user.get("content")).split()[-1][::-1]}

serve_scripted(ScriptedModel(chat=chat, record=False), int(sys.argv[1]))
"""

DRIVER = """
import asyncio, json, resource, sys, time

sys.path.insert(0, sys.argv[1])  # environment/hosted: host.py loads the adapter module
import host

def cpu():
    usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)

async def main(target, args, url, n, concurrency, warm_up, per_rollout, result):
    adapter = host._adapter_module("verifiers").Adapter(target, args)
    await adapter.describe()
    rows = await adapter.tasks(split="eval", start=0, count=n)
    bound = asyncio.Semaphore(concurrency)

    async def one(i, row):
        # per_rollout: a base URL of its own for each rollout, as rlbus's interception server
        # gives each (`.../r/TOKEN/v1`; the scripted server answers under any prefix).
        base_url = url.removesuffix("/v1") + f"/r/{i}/v1" if per_rollout else url
        endpoint = {"base_url": base_url, "model": "scripted"}
        async with bound:
            return await adapter.rollout(task=row, endpoint=endpoint)

    await asyncio.gather(*(one(-i, row) for i, row in enumerate(rows[:warm_up], 1)))
    used, started = cpu(), time.perf_counter()
    outs = await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))
    seconds, used = time.perf_counter() - started, cpu() - used
    await adapter.aclose()
    with open(result, "w") as out:
        json.dump({"seconds": seconds, "cpu": used, "outs": outs}, out)

target, args, url, n, concurrency, warm_up, per_rollout, result = sys.argv[2:]
args, n, concurrency, warm_up = json.loads(args), int(n), int(concurrency), int(warm_up)
asyncio.run(main(target, args, url, n, concurrency, warm_up, per_rollout == "1", result))
"""
"""The V1 adapter in-process: run by the venv's python, it loads the adapter module the way
host.py does (host._adapter_module) and plays the rollouts itself."""

console = Console(width=150)


def installed_venv() -> Path:
    """The example's venv in bench/out/envs, installed by rlbus's installer if not there."""
    record = read_record(ENVS / "reverse-text")
    if record is None:
        console.print(f"installing {EXAMPLE} into {ENVS} (verifiers 0.4 from the registry)")
        record = install_env(OUT, str(EXAMPLE), say=console.print)
    return Path(record.path)


def taskset_args(n: int, mode: str = "episode") -> dict[str, Any]:
    return {"mode": mode, "taskset": {"n": n}}


def check(outs: list[dict[str, Any]], n: int, side: str) -> None:
    wrong = [o for o in outs if o.get("error") or abs(o["reward"] - REWARD) > 1e-9]
    if len(outs) != n or wrong:
        raise RuntimeError(f"{side}: {len(outs)} rollouts, {len(wrong)} wrong, e.g. {wrong[:1]}")


# -- 1. vf-eval -----------------------------------------------------------------------------


def vf_eval(venv: Path, url: str, n: int, concurrency: int, out: Path) -> dict[str, Any]:
    """verifiers 0.4's `vf-eval` of the first `n` tasks, as tests/environments/
    test_hosted_verifiers.py runs it; its rate and CPU from its first rollout's start to its
    last score."""
    command = [
        *(str(venv / "bin" / "vf-eval"), TARGET, "--env.taskset.n", str(n)),
        *("-m", MODEL, "--client.base-url", url, "--client.api-key-var", "OPENAI_API_KEY"),
        *("-n", str(n), "-r", "1", "-c", str(concurrency), "--no-push", "--no-rich"),
        *("-o", str(out), "--env.agent.runtime.type", "subprocess"),
    ]
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "OPENAI_API_KEY": "x"}
    with (out.parent / f"{out.name}.log").open("w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=log)
        with TreeCpuSampler(proc.pid, every_s=0.05) as sampler:
            if proc.wait(timeout=1800):
                raise RuntimeError(f"vf-eval exited with {proc.returncode}: see {log.name}")
    episodes = [
        json.loads(line)
        for path in out.glob("*/traces.jsonl")
        for line in path.read_text().splitlines()
    ]
    traces = [e["traces"][0] for e in episodes]
    wrong = [t for t in traces if (t["rewards"].get("exact") or {}).get("score") != 1]
    if len(traces) != n or wrong:
        raise RuntimeError(f"vf-eval: {len(traces)} rollouts of {n}, {len(wrong)} wrong")
    start = min(t["timing"]["start"] for t in traces)
    end = max(t["timing"]["scoring"]["end"] for t in traces)
    agent = sum(t["timing"]["agent"]["end"] - t["timing"]["agent"]["start"] for t in traces)
    model = sum(t["timing"]["agent"]["model"]["duration"] for t in traces)
    return {
        "n": n,
        "seconds": end - start,
        "cpu": sampler.between(start, end),
        "agent_s": agent / n,
        "model_s": model / n,
    }


def measure_vf_eval(venv: Path, url: str, n: int, concurrency: int) -> dict[str, Any]:
    out = RUNS / "vf-eval"
    shutil.rmtree(out, ignore_errors=True)  # vf-eval refuses a run directory with results
    out.mkdir(parents=True)
    vf_eval(venv, url, WARM_UP, concurrency, out / "warm-up")
    got = vf_eval(venv, url, n, concurrency, out / "run")
    console.print(
        f"vf-eval: {n / got['seconds']:,.1f} rollouts/s, {1000 * got['cpu'] / n:.1f} ms CPU "
        f"per rollout; per rollout its agent stage took {1000 * got['agent_s']:.0f} ms "
        f"(model calls {1000 * got['model_s']:.0f} ms)"
    )
    return got


# -- 2. rlbus eval --------------------------------------------------------------------------


def store_settings(directory: Path) -> Settings:
    return load_settings(
        overrides={
            "store": {"url": f"chdb://{directory}/store"},
            "claim_check": {"url": f"file://{directory}/claims"},
        }
    )


def measure_rlbus(url: str, n: int, concurrency: int, tmp: Path, mode: str) -> dict[str, Any]:
    env: Environment = load_environment(
        f"verifiers:{TARGET}",
        {
            "model": {"name": MODEL, "base_url": url},
            "group_size": 1,
            "max_concurrent_rollouts": concurrency,
            "args": taskset_args(n, mode),
        },
    )
    worker = env.taskset.worker
    try:
        with local_broker(store_settings(tmp)) as (live, broker), local_sink(live) as sink:
            assert broker is not None and broker.pid and sink.process is not None
            run_eval(env, live, n=WARM_UP, run_id="warm-up", show_progress=False)
            assert worker.pid is not None
            worker_pid = worker.pid
            meter = CpuMeter(broker=broker.pid, sink=sink.process.proc.pid).start()
            worker_cpu = tree_cpu(worker_pid)
            result = run_eval(env, live, n=n, run_id="measured", show_progress=False)
            parts = meter.stop()
            parts["worker"] = tree_cpu(worker_pid) - worker_cpu
            assert worker.pid == worker_pid, "the worker was restarted mid-eval"
    finally:
        worker.close()
    rollouts = result.tally.rollouts
    assert result.report.rollouts == rollouts == n, result.report
    assert result.tally.errors == 0, result.report.errors
    assert abs(result.report.mean_reward - REWARD) < 1e-9, result.report.mean_reward
    cpu = sum(parts.values())
    console.print(
        f"rlbus eval ({mode}): {n / result.seconds:,.1f} rollouts/s, "
        f"{1000 * cpu / n:.1f} ms CPU per rollout: "
        + ", ".join(f"{k} {1000 * v / n:.1f}" for k, v in parts.items())
    )
    return {"n": n, "seconds": result.seconds, "cpu": cpu, "parts": parts}


# -- 3. the worker protocol -----------------------------------------------------------------


def measure_in_process(
    venv: Path, url: str, n: int, concurrency: int, per_rollout: bool = False
) -> dict[str, Any]:
    """The adapter driven in the venv's python, no protocol: rate and the driver's CPU.
    `per_rollout`: each rollout's endpoint a URL of its own, as in `rlbus eval`."""
    RUNS.mkdir(parents=True, exist_ok=True)
    name = "in-process-url-per-rollout" if per_rollout else "in-process"
    driver, result = RUNS / "driver.py", RUNS / f"{name}.json"
    driver.write_text(DRIVER)
    result.unlink(missing_ok=True)
    argv = [str(venv_python(venv)), str(driver), str(HOST.parent), TARGET]
    argv += [json.dumps(taskset_args(n)), url, str(n), str(concurrency), str(WARM_UP)]
    argv += ["1" if per_rollout else "0", str(result)]
    # As HostedWorker starts host.py: the same environment, the same directory.
    env = {**passed_environment(), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    with (RUNS / f"{name}.log").open("w") as log:
        subprocess.run(argv, env=env, stdout=log, stderr=log, check=True)
    got = json.loads(result.read_text())
    check(got["outs"], n, "in-process")
    return {"n": n, "seconds": got["seconds"], "cpu": got["cpu"]}


def measure_worker(venv: Path, url: str, n: int, concurrency: int) -> dict[str, Any]:
    """The same rollouts sent through HostedWorker to host.py: rate, and the CPU of this
    process (the requests, the reader thread) and of the worker's tree."""
    worker = HostedWorker(
        WorkerSpec(
            env=f"verifiers:{TARGET}",
            python=venv_python(venv),
            kind="verifiers",
            target=TARGET,
            args=taskset_args(n),
        )
    )
    endpoint = {"base_url": url, "model": MODEL}

    async def run(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        bound = asyncio.Semaphore(concurrency)

        async def one(row: dict[str, Any]) -> dict[str, Any]:
            async with bound:
                return await worker.acall("rollout", task=row, endpoint=endpoint)

        return await asyncio.gather(*(one(row) for row in rows))

    async def measured(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict]:
        await run(rows[:WARM_UP])
        pid = worker.pid
        assert pid is not None
        mine, theirs, started = own_cpu(), tree_cpu(pid), time.perf_counter()
        outs = await run(rows)
        seconds = time.perf_counter() - started
        parts = {"this process": own_cpu() - mine, "worker": tree_cpu(pid) - theirs}
        return outs, {"seconds": seconds, "parts": parts}

    try:
        worker.start()
        rows = worker.call("tasks", split="eval", start=0, count=n)
        outs, got = asyncio.run(measured(rows))
    finally:
        worker.close()
    check(outs, n, "worker")
    return {"n": n, "seconds": got["seconds"], "cpu": sum(got["parts"].values()), **got}


# -------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    n, c = args.tasks, args.concurrency
    os.environ["RLBUS_ENVS_DIR"] = str(ENVS)  # where `verifiers:reverse_text` is looked for
    venv = installed_venv()
    server, url = serve_in_child(SERVE)
    try:
        theirs = measure_vf_eval(venv, url, n, c)
        with tempfile.TemporaryDirectory() as tmp:
            ours = measure_rlbus(url, n, c, Path(tmp), "episode")
        with tempfile.TemporaryDirectory() as tmp:
            steps = measure_rlbus(url, n, c, Path(tmp), "steps")
        in_process = measure_in_process(venv, url, n, c)
        console.print(f"V1 adapter in-process: {n / in_process['seconds']:,.1f} rollouts/s")
        worker = measure_worker(venv, url, n, c)
        console.print(f"V1 adapter through HostedWorker: {n / worker['seconds']:,.1f} rollouts/s")
        # Not in the RESULT: what `rlbus eval`'s URL per rollout costs V1 by itself.
        per_url = measure_in_process(venv, url, n, c, per_rollout=True)
        console.print(
            f"V1 adapter in-process, a URL per rollout: {n / per_url['seconds']:,.1f} rollouts/s"
        )
    finally:
        server.terminate()
        server.wait()
    table = Table(
        "side",
        "rollouts/s",
        "CPU ms / rollout",
        "CPU by part, ms / rollout",
        title=(
            f"verifiers:{TARGET} (V1 one-turn harness, subprocess runtime), {n} rollouts, "
            f"concurrency {c}, scripted server in a child process"
        ),
    )

    def row(side: str, got: dict[str, Any], parts: dict[str, float] | None = None) -> None:
        split = ", ".join(f"{k} {1000 * v / n:.1f}" for k, v in (parts or {}).items())
        table.add_row(
            side, f"{n / got['seconds']:,.1f}", f"{1000 * got['cpu'] / n:.1f}", split or "-"
        )

    row("vf-eval (verifiers 0.4, its process tree)", theirs)
    row("rlbus eval (bus + sink + ClickHouse + worker)", ours, ours["parts"])
    row("rlbus eval, mode steps (rlbus's chat loop, V1's rewards)", steps, steps["parts"])
    row("V1 adapter in-process (venv's python)", in_process)
    row("V1 adapter through HostedWorker.acall", worker, worker["parts"])
    row("V1 adapter in-process, a base URL per rollout (as rlbus eval)", per_url)
    console.print(table)
    print(
        f"RESULT rlbus_vs_v1_eval={theirs['seconds'] / ours['seconds']:.3f} "
        f"cpu_per_rollout_vs_v1_eval={ours['cpu'] / theirs['cpu']:.3f} "
        f"worker_vs_in_process={in_process['seconds'] / worker['seconds']:.3f} "
        f"steps_vs_v1_eval={theirs['seconds'] / steps['seconds']:.3f} "
        f"steps_cpu_per_rollout_vs_v1_eval={steps['cpu'] / theirs['cpu']:.3f}"
    )


if __name__ == "__main__":
    main()
