"""Rollouts/s and CPU per rollout of one `command` harness under the `subprocess` and `sandbox`
runtimes, in alternating trials of one run. The program: a small Python agent (standard library
only, started with -S, as the venv's .pth hooks would add ~40 ms of CPU to every start) reads its
task and calls its model URL twice (draft, then check), on the reverse-text task set, against the
scripted model server (`tests/support`, a process of its own, so its CPU counts in neither
figure). Each trial is the env producer's rollout path without the bus: the real interception
server, harness and runtime.

    python bench/runtimes.py [--rollouts 100] [--concurrency 8] [--trials 2]

CPU per rollout = this process's CPU (interception server, harness, runtime) + the program
tree's CPU as its cgroup measured it (bubblewrap's own processes included), over rollouts.
Last line: RESULT sandbox_vs_subprocess=<sandbox rollouts/s / subprocess rollouts/s>.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlbus.environment import load_environment
from rlbus.producers.interception import EvalBackend, InterceptionServer
from rlbus.producers.rollouts import RolloutRunner
from rlbus.producers.runtimes import sandbox_problem

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support
from support import serve_in_child

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "reverse_text"
AGENT = """
import http.client, json, os, urllib.parse

url = urllib.parse.urlsplit(os.environ["OPENAI_BASE_URL"])
messages = list(json.load(open(os.environ["RLBUS_TASK_FILE"]))["messages"])
connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
for turn in ("draft", "check"):
    body = json.dumps({"model": os.environ["RLBUS_MODEL"], "messages": messages})
    connection.request("POST", url.path + "/chat/completions", body,
                       {"Content-Type": "application/json"})
    reply = json.loads(connection.getresponse().read())["choices"][0]["message"]
    messages += [reply, {"role": "user", "content": "Check it. Reply with the answer only."}]
print(reply["content"])
"""
RUNTIMES = ("subprocess", "sandbox")

console = Console()


@dataclass
class Trial:
    rollouts_per_s: float
    cpu_ms: float
    """Per rollout: this process plus the program's tree."""
    program_cpu_ms: float | None
    """Per rollout: the program's tree alone (None where no cgroup measured it)."""


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def trial(kind: str, upstream: str, agent: Path, rollouts: int, concurrency: int) -> Trial:
    env = load_environment(
        str(EXAMPLE),
        {
            "max_concurrent_rollouts": concurrency,
            "model": {"name": "scripted", "base_url": upstream},
            "harness": {"kind": "command", "command": ["{python}", "-S", str(agent)]},
            "runtime": {"kind": kind, "read_only": [str(agent.parent)]},
        },
    )
    tasks = list(env.tasks("bench").take(rollouts))
    async with InterceptionServer(EvalBackend(env.config.model), env.config.sampling) as server:
        runner = RolloutRunner(env, server)
        await runner.run_group(tasks[0])  # warm: imports, first connection, first probe
        started, cpu_started = time.perf_counter(), cpu_s()
        groups = await asyncio.gather(*(runner.run_group(t) for t in tasks))
        seconds, own_cpu = time.perf_counter() - started, cpu_s() - cpu_started
    outs = [o.rollout for group in groups for o in group]
    errors = [o.error for o in outs if o.status != "ok"]
    assert not errors, errors[:3]
    assert sum(o.info["state"]["stdout"].strip() == o.answer for o in outs) == len(outs)
    measured = [o.info["state"].get("program_cpu_s") for o in outs]
    program = None if None in measured else sum(measured) / len(outs)  # type: ignore[arg-type]
    return Trial(
        len(outs) / seconds,
        1e3 * (own_cpu / len(outs) + (program or 0.0)),
        None if program is None else 1e3 * program,
    )


SERVE = "import sys; from rlbus.launch.scripted_model import ScriptedModel, serve_scripted; "
SERVE += "serve_scripted(ScriptedModel(record=False), int(sys.argv[1]))"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    if sandbox_problem() is not None:
        sys.exit(f"the sandbox runtime cannot run here: {sandbox_problem()}")
    upstream, url = serve_in_child(SERVE)
    results: dict[str, list[Trial]] = {kind: [] for kind in RUNTIMES}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            agent = Path(tmp) / "agent.py"
            agent.write_text(AGENT)
            for _ in range(args.trials):
                for kind in RUNTIMES:
                    results[kind].append(
                        asyncio.run(trial(kind, url, agent, args.rollouts, args.concurrency))
                    )
    finally:
        upstream.kill()
        upstream.wait()
    table = Table(
        "runtime",
        "rollouts/s (best)",
        "all trials",
        "CPU ms per rollout",
        "of which the program's tree",
        title=f"{args.rollouts} rollouts per trial at concurrency {args.concurrency}",
    )
    best = {}
    for kind, trials in results.items():
        best[kind] = max(t.rollouts_per_s for t in trials)
        programs = [t.program_cpu_ms for t in trials if t.program_cpu_ms is not None]
        table.add_row(
            kind,
            f"{best[kind]:.1f}",
            "  ".join(f"{t.rollouts_per_s:.1f}" for t in trials),
            f"{statistics.median(t.cpu_ms for t in trials):.0f}",
            f"{statistics.median(programs):.0f}" if programs else "not measured (no cgroup)",
        )
    console.print(table)
    print(
        f"sandboxed rollouts: {best['sandbox']:.1f}/s "
        f"({best['sandbox'] / 1.5:.1f}x the ~1.5/s of verifiers 0.4's subprocess runtime, "
        "a figure from the issue, not measured here)"
    )
    print(f"RESULT sandbox_vs_subprocess={best['sandbox'] / best['subprocess']:.3f}")


if __name__ == "__main__":
    main()
