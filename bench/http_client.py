"""CPU an env producer spends per model call: rlbus's InferenceClient (aiohttp) against a
plain httpx.AsyncClient, the client the env producer used before.

Both POST the same /v1/generate body to the same server, at the same concurrency, in
alternating trials; the figure is this process's CPU time (user + system) per request, so
what the server costs does not count. The server is a canned /v1/generate in a child
process (a few-token answer after a 20 ms wait, like a tiny model's): the client's cost does
not depend on what computes the answer.

    python bench/http_client.py [--requests 3000] [--concurrency 128] [--trials 3]

Last line: RESULT client_cpu_vs_httpx=<InferenceClient CPU per request / httpx's>
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
from collections.abc import Awaitable, Callable

import httpx
import msgspec
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rlbus.bus import free_port
from rlbus.bus.waiting import wait_for
from rlbus.clients.inference_client import InferenceClient, healthy
from rlbus.clients.token_api import GenerateRequest, SamplingParams

SERVER = """
import asyncio, sys
import msgspec, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
from rlbus.clients.token_api import GenerateResult

ANSWER = msgspec.json.encode(
    GenerateResult(
        completion_ids=[5, 6, 7, 8, 9, 10, 11, 2],
        logprobs=[-0.1, -0.2, -0.3, -0.1, -0.2, -0.3, -0.1, -0.2],
        finish_reason="stop",
        prompt_tokens=40,
        policy_version=3,
        min_policy_version=3,
        max_policy_version=3,
    )
)

async def generate(request):
    await request.body()
    await asyncio.sleep(0.02)
    return Response(ANSWER, media_type="application/json")

async def health(request):
    return Response(b"ok")

routes = [Route("/v1/generate", generate, methods=["POST"]), Route("/health", health)]
uvicorn.run(Starlette(routes=routes), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""

PROMPT = list(range(40))
SAMPLING = SamplingParams(temperature=1.0, max_tokens=16)

console = Console()


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def timed(post: Callable[[], Awaitable[object]], requests: int, concurrency: int) -> float:
    """CPU seconds per request."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await post()

    started = cpu_s()
    await asyncio.gather(*(one() for _ in range(requests)))
    return (cpu_s() - started) / requests


async def rlbus_client(url: str, requests: int, concurrency: int) -> float:
    client = InferenceClient(url, timeout_s=60)
    try:
        return await timed(lambda: client.generate(PROMPT, SAMPLING), requests, concurrency)
    finally:
        await client.close()


async def httpx_client(url: str, requests: int, concurrency: int) -> float:
    body = msgspec.json.encode(GenerateRequest(prompt_ids=PROMPT, sampling=SAMPLING))
    async with httpx.AsyncClient(timeout=60) as client:

        async def post() -> object:
            response = await client.post(
                url + "/generate", content=body, headers={"content-type": "application/json"}
            )
            return msgspec.json.decode(response.content)

        return await timed(post, requests, concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    results: dict[str, list[float]] = {"InferenceClient (aiohttp)": [], "httpx.AsyncClient": []}
    try:
        wait_for(lambda: healthy(url), 30, f"the canned server at {url}")
        with Progress(console=console) as progress:
            task = progress.add_task("trials", total=2 * args.trials)
            for _ in range(args.trials):
                for name, run in zip(results, (rlbus_client, httpx_client), strict=True):
                    results[name].append(asyncio.run(run(url, args.requests, args.concurrency)))
                    progress.advance(task)
    finally:
        server.kill()
        server.wait()
    table = Table(
        "client",
        "CPU ms per request (best)",
        "all trials",
        title=f"{args.requests} requests at concurrency {args.concurrency}",
    )
    for name, per_request in results.items():
        table.add_row(
            name, f"{min(per_request) * 1e3:.3f}", "  ".join(f"{x * 1e3:.3f}" for x in per_request)
        )
    console.print(table)
    ours, theirs = (min(v) for v in results.values())
    print(f"RESULT client_cpu_vs_httpx={ours / theirs:.3f}")


if __name__ == "__main__":
    main()
