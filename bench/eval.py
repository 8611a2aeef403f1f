"""Rollouts/s of `rlbus eval` (embedded broker, sink process, chdb: bus and store on) on a
single-turn task against an instant scripted model server, next to a plain asyncio loop calling
the same server with the official `openai` client and storing nothing, in the same run.

    python bench/eval.py [--rollouts 4000] [--concurrency 128]

The eval's time runs from its first rollout until its last score is in ClickHouse; the broker
and the sink start just before it (the sink joins its consumer group during the eval, as in
`rlbus eval`). CPU per rollout: the plain loop's process; rlbus's process plus the broker and
the sink over the eval (the server's counts for neither; start-ups for neither). It also
prints what one rollout puts on each topic: messages, events and bytes. Last line:
RESULT eval_vs_plain_loop=<rollouts/s ratio> cpu_per_rollout_vs_plain_loop=<CPU ratio>
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import openai

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.records import from_record
from rlbus.bus.topic_reader import read_records
from rlbus.config import Settings, load_settings
from rlbus.config.env import cli_overrides
from rlbus.environment import load_environment
from rlbus.launch.eval import run_eval
from rlbus.launch.local_sink import local_sink
from rlbus.schemas import TOPICS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support
from support import CpuMeter, own_cpu, serve_in_child

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "reverse_text"


SERVE = "import sys; from rlbus.launch.scripted_model import ScriptedModel, serve_scripted; "
SERVE += "serve_scripted(ScriptedModel(record=False), int(sys.argv[1]))"


async def plain_loop(url: str, prompts: list[list[dict]], concurrency: int) -> tuple[float, float]:
    """The baseline: the official client, a semaphore, nothing recorded. Returns rollouts/s and
    CPU seconds per rollout."""
    client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
    limit = asyncio.Semaphore(concurrency)

    async def one(messages: list[dict]) -> str:
        async with limit:
            reply = await client.chat.completions.create(
                model="scripted", messages=messages, max_tokens=64, temperature=0.7
            )
            return reply.choices[0].message.content or ""

    await asyncio.gather(*(one(p) for p in prompts[:concurrency]))  # warm the connection pool
    cpu, started = own_cpu(), time.perf_counter()
    answers = await asyncio.gather(*(one(p) for p in prompts))
    seconds, cpu = time.perf_counter() - started, own_cpu() - cpu
    assert all(answers)
    await client.close()
    return len(prompts) / seconds, cpu / len(prompts)


async def traffic(settings: Settings) -> dict[str, tuple[int, int, int]]:
    """Per topic: the messages on it, the events they hold and their bytes (values + headers)."""
    out = {}
    async with Bus.of(settings) as bus:
        for topic in TOPICS:
            records = await read_records(bus, topic.name)
            if not records:
                continue
            events = sum(len(from_record(topic.name, r, bus.claims)) for r in records)
            size = sum(
                len(r.value or b"") + sum(len(k) + len(v) for k, v in r.headers) for r in records
            )
            out[topic.name] = (len(records), events, size)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=128)
    args = parser.parse_args()
    server, url = serve_in_child(SERVE)
    try:
        env = load_environment(
            str(EXAMPLE), cli_overrides("scripted", url, 1, args.concurrency, None, None)
        )
        prompts = [env.taskset.messages(t) for t in env.tasks().take(args.rollouts)]
        plain, plain_cpu = asyncio.run(plain_loop(url, prompts, args.concurrency))
        print(
            f"plain asyncio loop (openai client, no persistence): {plain:,.0f} rollouts/s, "
            f"{1000 * plain_cpu:.2f} ms CPU per rollout"
        )
        with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
            settings = load_settings(
                overrides={
                    "kafka": {"bootstrap_servers": broker.bootstrap_servers},
                    "store": {"url": f"chdb://{tmp}/store"},
                    "claim_check": {"url": f"file://{tmp}/claims"},
                }
            )
            with local_sink(settings) as sink:
                assert broker.pid and sink.process is not None
                meter = CpuMeter(broker=broker.pid, sink=sink.process.proc.pid).start()
                started = time.monotonic()
                result = run_eval(env, settings, n=args.rollouts, show_progress=False)
                total = time.monotonic() - started
                used = meter.stop()
            wire = asyncio.run(traffic(settings))
        assert result.report.rollouts == args.rollouts and result.tally.errors == 0, result.report
        rollouts = result.tally.rollouts
        ours, our_cpu = rollouts / result.seconds, meter.total / rollouts
        print(
            f"rlbus eval (bus + sink + ClickHouse): {ours:,.0f} rollouts/s, "
            f"{1000 * our_cpu:.2f} ms CPU per rollout ({rollouts:,} rollouts, "
            f"{result.seconds:.1f}s to the last score stored; {total - result.seconds:.1f}s "
            "report)"
        )
        print(
            "  CPU ms per rollout: "
            + ", ".join(f"{k} {1000 * v / rollouts:.2f}" for k, v in used.items())
        )
        print("  per rollout, by topic: messages, events, bytes (values + headers)")
        for topic, (messages, events, size) in wire.items():
            print(
                f"    {topic:12s} {messages / rollouts:5.2f} {events / rollouts:6.2f} "
                f"{size / rollouts:8,.0f}"
            )
        messages, events, size = (sum(w[i] for w in wire.values()) / rollouts for i in range(3))
        print(f"    {'all':12s} {messages:5.2f} {events:6.2f} {size:8,.0f}")
        print(f"mean reward {result.report.mean_reward:.3f}, concurrency {args.concurrency}")
        print(
            f"RESULT eval_vs_plain_loop={ours / plain:.3f} "
            f"cpu_per_rollout_vs_plain_loop={our_cpu / plain_cpu:.3f}"
        )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
