"""Finding 2, the interception server's side: one 200 MiB request took the env producer to
2.2 GiB RSS (no body limit), and a rollout's token was accepted from anyone who knew it."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import ScriptedServer

from rlbus.config.env import ModelConfig
from rlbus.producers.interception import EvalBackend, InterceptionServer

SERVE = """
import asyncio, sys
from rlbus.config.env import ModelConfig
from rlbus.producers.interception import EvalBackend, InterceptionServer

async def main():
    backend = EvalBackend(ModelConfig(name="scripted", base_url=sys.argv[1]))
    async with InterceptionServer(backend) as server:
        with server.session("victim") as session:
            print(session.base_url, flush=True)
            await asyncio.sleep(3600)

asyncio.run(main())
"""
MIB = 1 << 20


@contextlib.contextmanager
def interception_process(upstream: ScriptedServer) -> Iterator[tuple[subprocess.Popen, str]]:
    """The real interception server in a process of its own, so its memory can be measured."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, f"{upstream.url}/v1"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:"), base_url
        yield proc, base_url
    finally:
        proc.kill()
        proc.wait()


def memory_mib(pid: int) -> dict[str, float]:
    """Resident now and at peak (VmRSS, VmHWM), MiB."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {k: int(status[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}


def post_huge(url: str, size: int, chunked: bool) -> tuple[int, str, float]:
    """POST `size` bytes, 1 MiB at a time, reading the answer while sending (a server may answer
    before the body is done). Returns status, body and the seconds it took."""
    host, port = url.removeprefix("http://").split("/", 1)[0].split(":")
    path = "/" + url.removeprefix("http://").split("/", 1)[1] + "/chat/completions"
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    received = bytearray()
    started = time.monotonic()
    with socket.create_connection((host, int(port))) as sock:

        def read() -> None:
            with contextlib.suppress(OSError):
                while chunk := sock.recv(65536):
                    received.extend(chunk)

        reader = threading.Thread(target=read)
        reader.start()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            "Content-Type: application/json\r\n"
        )
        sock.sendall(f"{head}{framing}\r\n\r\n".encode())
        block = b"x" * MIB
        with contextlib.suppress(OSError):
            for _ in range(size // MIB):
                if received:
                    break
                sock.sendall(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
            if chunked and not received:
                sock.sendall(b"0\r\n\r\n")
        reader.join(30)
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    assert head, "no answer"
    return int(head.split()[1]), body.decode(errors="replace"), time.monotonic() - started


@pytest.mark.slow
def test_a_200_mib_request_is_refused_without_the_server_growing(upstream: ScriptedServer) -> None:
    with interception_process(upstream) as (proc, base_url):
        # A normal call first, so the server has done its usual allocations.
        ok = httpx.post(
            f"{base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "Reverse the text: ab"}]},
        )
        assert ok.status_code == 200, ok.text
        before = memory_mib(proc.pid)
        declared = post_huge(base_url, 200 * MIB, chunked=False)
        after_declared = memory_mib(proc.pid)
        streamed = post_huge(base_url, 200 * MIB, chunked=True)
        after = memory_mib(proc.pid)
        print(
            f"before {before}, after the declared 200 MiB {after_declared}, after chunked {after}"
        )
        for status, body, _ in (declared, streamed):
            assert status == 413, body[:300]
            assert "max_request_mb" in json.loads(body)["error"]["message"]
        # Declared too large: refused before reading. Chunked: read up to the limit (32 MiB).
        assert after_declared["VmHWM"] - before["VmHWM"] < 16, (before, after_declared)
        assert after["VmHWM"] - before["VmHWM"] < 100, (before, after)


async def test_a_token_is_accepted_only_through_its_own_rollouts_listener(
    upstream: ScriptedServer,
) -> None:
    backend = EvalBackend(ModelConfig(name="scripted", base_url=f"{upstream.url}/v1"))
    body = {"model": "m", "messages": [{"role": "user", "content": "Reverse the text: ab"}]}
    async with InterceptionServer(backend) as server, httpx.AsyncClient() as client:
        with server.session("rollout-a") as a, server.session("rollout-b") as b:
            own_a = socket.create_server(("127.0.0.1", 0))
            own_b = socket.create_server(("127.0.0.1", 0))
            async with a.serving(own_a), b.serving(own_b):
                port_a = own_a.getsockname()[1]
                through_a = f"http://127.0.0.1:{port_a}/r/{{}}/v1/chat/completions"
                mine = await client.post(through_a.format(a.token), json=body)
                theirs = await client.post(through_a.format(b.token), json=body)
                shared = await client.post(f"{b.base_url}/chat/completions", json=body)
            assert mine.status_code == 200, mine.text
            assert (theirs.status_code, shared.status_code) == (403, 403), (theirs, shared)
            assert "another rollout" in theirs.json()["error"]["message"]
            assert len(a.trace.completion()) == 1 and b.trace.completion() == []
