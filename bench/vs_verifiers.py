"""rlbus eval next to verifiers, on the same task, scripted server and concurrency.

    python bench/vs_verifiers.py [--tasks 500] [--group 4] [--concurrency 128]
    python bench/vs_verifiers.py --v1 [--v1-rollouts 64] [--v1-concurrency 8]
                                      [--tasks 1000] [--concurrency 64]

Classic API (default): one verifiers environment (examples/verifiers/vf_reverse_text.py,
defined the verifiers way: system prompt, few-shot, parser, weighted rewards, a metric, a group
reward) evaluated by verifiers' own in-process eval (`env.evaluate`, its rollout loop, client
and rubric) and by `rlbus eval` (the embedded broker, a sink process storing into chdb, the
rubric's functions run by rlbus's scorer). Each side first warms up on a few tasks. Rollouts/s:
verifiers' from the start of `evaluate` to its return; rlbus's from its first rollout until its
last score is in ClickHouse. CPU per rollout: verifiers' process; rlbus's process plus the
broker and the sink over its eval (what the server costs counts for neither). Last line:
RESULT rlbus_vs_verifiers=<rollouts/s ratio> cpu_per_rollout_vs_verifiers=<CPU ratio>

V1 (`--v1`): verifiers 0.4's `vf-eval` (its own venv, bench/out/verifiers-v1-venv, made through
pip the first time: 0.4 pins openai<3 and mcp==2.0.0) on rlbus's reverse_text tasks as a V1
taskset (bench/verifiers_v1), twice: its `null` harness in its `subprocess` runtime (a chat
program per rollout), next to `rlbus eval` with a `command` harness (a standard-library Python
program per rollout) in the `sandbox` runtime; and a harness that runs its chat turn
in-process, next to `rlbus eval`'s own chat harness in the `local` runtime. Rollouts/s:
verifiers' from its first rollout's start to its last score (its traces' timestamps), its CPU
over that window (vf-eval's process tree, sampled); rlbus's as above. Last line:
RESULT rlbus_vs_v1_subprocess=<ratio> cpu_per_rollout_vs_v1_subprocess=<ratio>
       rlbus_vs_v1_in_process=<ratio> cpu_per_rollout_vs_v1_in_process=<ratio>
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

from rlbus.config import Settings, load_settings
from rlbus.discovery import local_broker
from rlbus.environment import Environment, load_environment
from rlbus.launch.eval import run_eval
from rlbus.launch.local_sink import local_sink
from rlbus.producers.runtimes import sandbox_problem

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support
from support import CpuMeter, TreeCpuSampler, own_cpu, serve_in_child
from support.venvs import own_venv

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / "examples" / "verifiers"
NAME = "vf_reverse_text"
REVERSE_TEXT = ROOT / "examples" / "reverse_text"
V1_VENV = ROOT / "bench" / "out" / "verifiers-v1-venv"
V1_PLUGINS = ROOT / "bench" / "verifiers_v1"
V1_OUT = ROOT / "bench" / "out" / "vs_verifiers_v1"
"""vf-eval's run directories and logs."""
V1_PACKAGES = ["verifiers==0.4.0", "uv"]
"""uv: the null harness prepares its chat program's environment with it (a PEP 723 script)."""
AGENT = """
import http.client, json, os, urllib.parse

url = urllib.parse.urlsplit(os.environ["OPENAI_BASE_URL"])
task = json.load(open(os.environ["RLBUS_TASK_FILE"]))
connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
body = json.dumps({"model": os.environ["RLBUS_MODEL"], "messages": task["messages"]})
headers = {"Content-Type": "application/json"}
connection.request("POST", url.path + "/chat/completions", body, headers)
print(json.loads(connection.getresponse().read())["choices"][0]["message"]["content"])
"""
"""The command harness's program: one chat turn, like V1's null harness on a single-turn task
(standard library only, started with -S, as bench/runtimes.py's)."""

SERVE = """
import sys
from rlbus.schemas.chat import text_of
from support import ScriptedModel, serve_scripted

def chat(messages, tools):
    # The last user message's last word, reversed (the few-shot example comes first).
    user = next(m for m in reversed(messages) if m.get("role") == "user")
    return {"content": text_of(user.get("content")).split()[-1][::-1]}

serve_scripted(ScriptedModel(chat=chat, record=False), int(sys.argv[1]))
"""


def verifiers_eval(env: Environment, url: str, tasks: int, group: int, concurrency: int) -> dict:
    """verifiers' own evaluation; its progress bar and log replaced by nothing."""
    import verifiers as vf

    client = vf.ClientConfig(api_base_url=url, api_key_var="OPENAI_API_KEY", max_retries=0)
    quiet = {"on_start": lambda *a: None, "on_progress": lambda *a: None, "on_log": lambda m: None}
    return asyncio.run(
        env.taskset.vf_env.evaluate(
            client,
            "scripted",
            num_examples=tasks,
            rollouts_per_example=group,
            max_concurrent=max(1, concurrency // group),  # it bounds groups, not rollouts
            **quiet,
        )
    )


def measure_verifiers(env: Environment, url: str, args: argparse.Namespace) -> tuple[float, float]:
    verifiers_eval(env, url, 8, args.group, args.concurrency)  # warm-up
    cpu, started = own_cpu(), time.perf_counter()
    out = verifiers_eval(env, url, args.tasks, args.group, args.concurrency)
    seconds, cpu = time.perf_counter() - started, own_cpu() - cpu
    rollouts = len(out["outputs"])
    assert rollouts == args.tasks * args.group, rollouts
    reward = sum(o["reward"] for o in out["outputs"]) / rollouts
    print(
        f"verifiers {vf_version()} evaluate (in-process, nothing stored): "
        f"{rollouts / seconds:,.0f} rollouts/s, {1000 * cpu / rollouts:.2f} ms CPU per rollout "
        f"({rollouts:,} rollouts in {seconds:.1f}s, mean reward {reward:.3f})"
    )
    return rollouts / seconds, cpu / rollouts


def measure_rlbus(
    env: Environment, settings: Settings, tasks: int, label: str = "rlbus eval"
) -> tuple[float, float]:
    """Rollouts/s and CPU seconds per rollout of `rlbus eval` of `tasks` tasks (after a warm-up
    of 8), with the broker and the sink it publishes to."""
    with local_broker(settings) as (live, broker), local_sink(live) as sink:
        assert broker is not None and broker.pid and sink.process is not None
        run_eval(env, live, n=8, run_id="warm-up", show_progress=False)
        meter = CpuMeter(broker=broker.pid, sink=sink.process.proc.pid).start()
        result = run_eval(env, live, n=tasks, run_id="measured", show_progress=False)
        parts = meter.stop()
    rollouts = result.tally.rollouts
    assert result.report.rollouts == rollouts == tasks * env.config.group_size, result.report
    assert result.tally.errors == 0, result.report.errors
    print(
        f"{label} (bus + sink + ClickHouse): {rollouts / result.seconds:,.1f} rollouts/s, "
        f"{1000 * meter.total / rollouts:.2f} ms CPU per rollout with the broker and the sink "
        f"({rollouts:,} rollouts in {result.seconds:.1f}s to the last score stored, "
        f"mean reward {result.report.mean_reward:.3f})"
    )
    print(
        "  CPU ms per rollout: "
        + ", ".join(f"{k} {1000 * v / rollouts:.2f}" for k, v in parts.items())
    )
    return rollouts / result.seconds, meter.total / rollouts


def vf_version() -> str:
    import verifiers

    return verifiers.__version__


def write_v1_tasks(path: Path, n: int) -> None:
    """The first `n` of rlbus's reverse_text evaluation tasks, as the V1 taskset reads them."""
    env = load_environment(str(REVERSE_TEXT), {"model": {"name": "scripted", "base_url": "-"}})
    with path.open("w") as out:
        for task in env.eval_tasks().take(n):
            messages = env.taskset.messages(task)
            row = {"system": messages[0]["content"], "prompt": messages[-1]["content"]}
            out.write(json.dumps({**row, "answer": task.answer}) + "\n")


def v1_eval(url: str, tasks: Path, n: int, concurrency: int, harness: str, out: Path) -> list[Any]:
    """verifiers 0.4's `vf-eval` of the first `n` tasks in its `subprocess` runtime; returns
    each rollout's trace and the CPU its process tree spent from its first rollout's start to
    its last score."""
    command = [
        *(str(V1_VENV / "bin" / "vf-eval"), "vf_reverse_text_v1"),
        *("--env.taskset.path", str(tasks), "-m", "scripted", "--client.base-url", url),
        *("--client.api-key-var", "OPENAI_API_KEY", "-n", str(n), "-r", "1"),
        *("-c", str(concurrency), "--no-push", "--no-rich", "-o", str(out)),
        *("--env.agent.harness.id", harness, "--env.agent.runtime.type", "subprocess"),
    ]
    plugins = {
        "PYTHONPATH": str(V1_PLUGINS),
        "OPENAI_API_KEY": "scripted",
        # The null harness finds uv on PATH (installed into this venv for it), else it
        # downloads uv's installer, which a machine without internet cannot.
        "PATH": os.pathsep.join([str(V1_VENV / "bin"), os.environ.get("PATH", "")]),
    }
    with (out.parent / f"{out.name}.log").open("w") as log:
        proc = subprocess.Popen(command, env={**os.environ, **plugins}, stdout=log, stderr=log)
        with TreeCpuSampler(proc.pid) as sampler:
            if proc.wait(timeout=3600):
                raise RuntimeError(f"vf-eval exited with {proc.returncode}: see {log.name}")
    episodes = [
        json.loads(line)
        for path in out.glob("*/traces.jsonl")
        for line in path.read_text().splitlines()
    ]
    wrong = [e for e in episodes if e["traces"][0]["rewards"].get("exact", {}).get("score") != 1]
    if wrong:
        raise RuntimeError(
            f"{len(wrong)} of vf-eval's {len(episodes)} rollouts did not answer right, e.g. "
            f"{json.dumps(wrong[0]['errors'] or wrong[0]['traces'][0].get('errors'))[:1500]}"
        )
    traces = [e["traces"][0] for e in episodes]
    start = min(t["timing"]["start"] for t in traces)
    end = max(t["timing"]["scoring"]["end"] for t in traces)
    return [traces, end - start, sampler.between(start, end)]


def measure_v1(
    url: str, tasks: Path, n: int, concurrency: int, harness: str
) -> tuple[float, float]:
    """Rollouts/s and CPU seconds per rollout of `vf-eval` with `harness`, after a warm-up run
    (its imports compiled, the null harness's program environment in uv's cache)."""
    out = V1_OUT / harness
    shutil.rmtree(out, ignore_errors=True)  # vf-eval refuses a run directory with results
    out.mkdir(parents=True)
    v1_eval(url, tasks, 4, concurrency, harness, out / "warm-up")
    traces, seconds, cpu = v1_eval(url, tasks, n, concurrency, harness, out / "run")
    assert len(traces) == n, (len(traces), n)
    print(
        f"verifiers {V1_PACKAGES[0].split('==')[1]} vf-eval, {harness} harness, subprocess "
        f"runtime: {n / seconds:,.1f} rollouts/s, {1000 * cpu / n:.2f} ms CPU per rollout "
        f"({n} rollouts in {seconds:.1f}s, every answer right)"
    )
    return n / seconds, cpu / n


def reverse_text(url: str, concurrency: int, **config: Any) -> Environment:
    return load_environment(
        str(REVERSE_TEXT),
        {
            "model": {"name": "scripted", "base_url": url},
            "group_size": 1,
            "max_concurrent_rollouts": concurrency,
            **config,
        },
    )


def v1(args: argparse.Namespace, url: str, tmp: Path) -> None:
    """verifiers 0.4 (V1) and rlbus side by side: a program per rollout, then in-process."""
    if problem := sandbox_problem():
        sys.exit(f"the sandbox runtime cannot run here: {problem}")
    own_venv(V1_VENV, [V1_PACKAGES], "import verifiers.v1, uv")
    tasks = tmp / "tasks.jsonl"
    write_v1_tasks(tasks, max(args.tasks, args.v1_rollouts) + 8)
    agent = tmp / "agent.py"
    agent.write_text(AGENT)
    command = {
        "harness": {"kind": "command", "command": ["{python}", "-S", str(agent)]},
        "runtime": {"kind": "sandbox", "read_only": [str(agent.parent)]},
    }
    n, c = args.v1_rollouts, args.v1_concurrency
    print(f"A program per rollout: {n} rollouts, concurrency {c}")
    theirs = measure_v1(url, tasks, n, c, "null")
    ours = measure_rlbus(
        reverse_text(url, c, **command),
        store_settings(tmp / "a"),
        n,
        "rlbus eval, command harness, sandbox runtime",
    )
    n, c = args.tasks, args.concurrency
    print(f"In-process: {n} rollouts, concurrency {c}")
    theirs_in = measure_v1(url, tasks, n, c, "vf_chat_in_process")
    ours_in = measure_rlbus(
        reverse_text(url, c), store_settings(tmp / "b"), n, "rlbus eval, chat harness"
    )
    print(
        f"RESULT rlbus_vs_v1_subprocess={ours[0] / theirs[0]:.3f} "
        f"cpu_per_rollout_vs_v1_subprocess={ours[1] / theirs[1]:.3f} "
        f"rlbus_vs_v1_in_process={ours_in[0] / theirs_in[0]:.3f} "
        f"cpu_per_rollout_vs_v1_in_process={ours_in[1] / theirs_in[1]:.3f}"
    )


def store_settings(directory: Path) -> Settings:
    return load_settings(
        overrides={
            "store": {"url": f"chdb://{directory}/store"},
            "claim_check": {"url": f"file://{directory}/claims"},
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--v1", action="store_true", help="verifiers 0.4 (V1) side by side")
    parser.add_argument("--v1-rollouts", type=int, default=64, help="with a program each")
    parser.add_argument("--v1-concurrency", type=int, default=8, help="with a program each")
    args = parser.parse_args()
    sys.path.insert(0, str(ENVS))  # the environment installed the way vf-eval finds it
    os.environ.setdefault("OPENAI_API_KEY", "scripted")
    server, url = serve_in_child(SERVE)
    try:
        if args.v1:
            with tempfile.TemporaryDirectory() as tmp:
                v1(args, url, Path(tmp))
            return
        env = load_environment(
            f"verifiers:{NAME}",
            {
                "args": {"eval_n": args.tasks},
                "model": {"name": "scripted", "base_url": url},
                "group_size": args.group,
                "max_concurrent_rollouts": args.concurrency,
            },
        )
        theirs, their_cpu = measure_verifiers(env, url, args)
        with tempfile.TemporaryDirectory() as tmp:
            ours, our_cpu = measure_rlbus(env, store_settings(Path(tmp)), args.tasks)
        print(f"{args.tasks} tasks x {args.group} rollouts, concurrency {args.concurrency}")
        print(
            f"RESULT rlbus_vs_verifiers={ours / theirs:.3f} "
            f"cpu_per_rollout_vs_verifiers={our_cpu / their_cpu:.3f}"
        )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
