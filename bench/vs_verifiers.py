"""One verifiers environment (examples/verifiers/vf_reverse_text.py, defined the verifiers way:
system prompt, few-shot, parser, weighted rewards, a metric, a group reward) evaluated by
verifiers' own in-process eval (`env.evaluate`, its rollout loop, client and rubric) and by
`rlbus eval` (the embedded broker, a sink process storing into chdb, the rubric's functions run
by rlbus's scorer), against the same scripted OpenAI-compatible server in a child process.

    python bench/vs_verifiers.py [--tasks 500] [--group 4] [--concurrency 128]

Each side first warms up on a few tasks. Rollouts/s: verifiers' from the start of `evaluate` to
its return; rlbus's from its first rollout until its last score is in ClickHouse. CPU per
rollout: verifiers' process; rlbus's process plus the broker and the sink over its eval (what
the server costs counts for neither). Last line:
RESULT rlbus_vs_verifiers=<rollouts/s ratio> cpu_per_rollout_vs_verifiers=<CPU ratio>
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from rlbus.config import Settings, load_settings
from rlbus.discovery import local_broker
from rlbus.launch.eval import run_eval
from rlbus.launch.local_sink import local_sink
from rlbus.producers.environment import Environment, load_environment
from rlbus.testing import serve_in_child

ENVS = Path(__file__).resolve().parent.parent / "examples" / "verifiers"
NAME = "vf_reverse_text"

SERVE = """
import sys
from rlbus.schemas.chat import text_of
from rlbus.testing import ScriptedModel, serve

def chat(messages, tools):
    # The last user message's last word, reversed (the few-shot example comes first).
    user = next(m for m in reversed(messages) if m.get("role") == "user")
    return {"content": text_of(user.get("content")).split()[-1][::-1]}

serve(ScriptedModel(chat=chat, record=False), int(sys.argv[1]))
"""


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a live process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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
    env: Environment, settings: Settings, args: argparse.Namespace
) -> tuple[float, float]:
    with local_broker(settings) as (live, broker), local_sink(live) as sink:
        assert broker is not None and broker.pid and sink.process is not None
        pids = [broker.pid, sink.process.proc.pid]

        def cpu() -> list[float]:
            return [own_cpu(), *(cpu_of(pid) for pid in pids)]

        run_eval(env, live, n=8, run_id="warm-up", show_progress=False)
        before = cpu()
        result = run_eval(env, live, n=args.tasks, run_id="measured", show_progress=False)
        parts = [after - start for after, start in zip(cpu(), before, strict=True)]
        used = sum(parts)
    rollouts = result.tally.rollouts
    assert result.report.rollouts == rollouts == args.tasks * args.group, result.report
    assert result.tally.errors == 0, result.report.errors
    print(
        f"rlbus eval (bus + sink + ClickHouse): {rollouts / result.seconds:,.0f} rollouts/s, "
        f"{1000 * used / rollouts:.2f} ms CPU per rollout with the broker and the sink "
        f"({rollouts:,} rollouts in {result.seconds:.1f}s to the last score stored, "
        f"mean reward {result.report.mean_reward:.3f})"
    )
    shares = zip(("eval process", "broker", "sink"), parts, strict=True)
    print("  CPU ms per rollout: " + ", ".join(f"{k} {1000 * v / rollouts:.2f}" for k, v in shares))
    return rollouts / result.seconds, used / rollouts


def vf_version() -> str:
    import verifiers

    return verifiers.__version__


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=128)
    args = parser.parse_args()
    sys.path.insert(0, str(ENVS))  # the environment installed the way vf-eval finds it
    os.environ.setdefault("OPENAI_API_KEY", "scripted")
    server, url = serve_in_child(SERVE)
    try:
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
            settings = load_settings(
                overrides={
                    "store": {"url": f"chdb://{tmp}/store"},
                    "claim_check": {"url": f"file://{tmp}/claims"},
                }
            )
            ours, our_cpu = measure_rlbus(env, settings, args)
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
