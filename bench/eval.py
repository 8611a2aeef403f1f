"""Rollouts/s of `rlbus eval` (embedded broker, sink process, chdb: bus and store on) on a
single-turn task against an instant scripted model server, next to a plain asyncio loop calling
the same server with the official `openai` client and storing nothing, in the same run.

    python bench/eval.py [--rollouts 4000] [--concurrency 128]

The eval's time runs from its first rollout until its last score is in ClickHouse; broker and
sink start-up is reported separately. Last line: RESULT eval_vs_plain_loop=<ratio>.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import openai

from rlbus.config import load_settings
from rlbus.config.env import cli_overrides
from rlbus.launch.eval import run_eval
from rlbus.producers.environment import load_environment
from rlbus.testing import serve_in_child

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "reverse_text"


SERVE = "import sys; from rlbus.testing import ScriptedModel, serve; "
SERVE += "serve(ScriptedModel(record=False), int(sys.argv[1]))"


async def plain_loop(url: str, prompts: list[list[dict]], concurrency: int) -> float:
    """The baseline: the official client, a semaphore, nothing recorded. Returns rollouts/s."""
    client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
    limit = asyncio.Semaphore(concurrency)

    async def one(messages: list[dict]) -> str:
        async with limit:
            reply = await client.chat.completions.create(
                model="scripted", messages=messages, max_tokens=64, temperature=0.7
            )
            return reply.choices[0].message.content or ""

    await asyncio.gather(*(one(p) for p in prompts[:concurrency]))  # warm the connection pool
    started = time.perf_counter()
    answers = await asyncio.gather(*(one(p) for p in prompts))
    seconds = time.perf_counter() - started
    assert all(answers)
    await client.close()
    return len(prompts) / seconds


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
        plain = asyncio.run(plain_loop(url, prompts, args.concurrency))
        print(f"plain asyncio loop (openai client, no persistence): {plain:,.0f} rollouts/s")
        with tempfile.TemporaryDirectory() as tmp:
            settings = load_settings(
                overrides={
                    "store": {"url": f"chdb://{tmp}/store"},
                    "claim_check": {"url": f"file://{tmp}/claims"},
                }
            )
            started = time.monotonic()
            result = run_eval(env, settings, n=args.rollouts, show_progress=False)
            total = time.monotonic() - started
        assert result.report.rollouts == args.rollouts and result.tally.errors == 0, result.report
        ours = result.tally.rollouts / result.seconds
        print(
            f"rlbus eval (bus + sink + ClickHouse): {ours:,.0f} rollouts/s "
            f"({result.tally.rollouts:,} rollouts, {result.seconds:.1f}s to the last score stored; "
            f"{total - result.seconds:.1f}s broker/sink start-up and report)"
        )
        print(f"mean reward {result.report.mean_reward:.3f}, concurrency {args.concurrency}")
        print(f"RESULT eval_vs_plain_loop={ours / plain:.3f}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
