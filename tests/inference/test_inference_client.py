"""The inference client against a server that closes idle kept-alive connections, as uvicorn
does after 5 s. A request sent on a pooled connection just as the server closes it finds it
gone before any answer: the experts bench's joint run lost a held-out rollout to it
(`inference http://127.0.0.1:58675/v1/generate unreachable: ServerDisconnectedError('Server
disconnected')`) with the server up and answering every other call. Such a request was never
read, so it is sent again on a new connection; a server that breaks off after it began to answer
is still an error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import msgspec
import pytest

from rlbus.clients.inference_client import InferenceClient, InferenceError
from rlbus.clients.token_api import GenerateResult, SamplingParams

RESULT = msgspec.json.encode(
    GenerateResult(
        completion_ids=[5, 6],
        logprobs=[-0.5, -0.25],
        finish_reason="length",
        prompt_tokens=3,
        policy_version=0,
        min_policy_version=0,
        max_policy_version=0,
    )
)


async def _read_request(reader: asyncio.StreamReader) -> bool:
    """Read one HTTP/1.1 request; False when the client closed the connection instead."""
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    if not head:
        return False
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    json.loads(await reader.readexactly(length))
    return True


def _answer(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )


@asynccontextmanager
async def server(on_second: Callable[[asyncio.StreamWriter], bytes | None]) -> AsyncIterator[dict]:
    """A server on 127.0.0.1 answering the first request of each connection and keeping it
    open; the second request on a connection gets `on_second`'s bytes, then the connection is
    closed. Counts connections and requests."""
    seen = {"connections": 0, "requests": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connections"] += 1
        served = 0
        try:
            while await _read_request(reader):
                seen["requests"] += 1
                served += 1
                if served == 1:
                    writer.write(_answer(RESULT))
                    await writer.drain()
                    continue
                if (reply := on_second(writer)) is not None:
                    writer.write(reply)
                    await writer.drain()
                break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listening = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    seen["url"] = f"http://127.0.0.1:{port}/v1"
    async with listening:
        yield seen


async def test_a_request_on_a_connection_the_server_closed_is_sent_again() -> None:
    async with server(on_second=lambda _: None) as seen:
        client = InferenceClient(seen["url"])
        try:
            for _ in range(3):
                got = await client.generate([1, 2, 3], SamplingParams(max_tokens=2))
                assert got.completion_ids == [5, 6]
        finally:
            await client.close()
    # the 2nd and 3rd calls each found their pooled connection closed and went again on a new one
    assert seen["requests"] == 5 and seen["connections"] == 3


async def test_a_server_that_breaks_off_its_answer_is_still_an_error() -> None:
    half = _answer(RESULT)[:-5]  # headers and part of the body, then the connection closes
    async with server(on_second=lambda _: half) as seen:
        client = InferenceClient(seen["url"])
        try:
            await client.generate([1, 2, 3], SamplingParams(max_tokens=2))
            with pytest.raises(InferenceError, match="unreachable|broke off"):
                await client.generate([1, 2, 3], SamplingParams(max_tokens=2))
        finally:
            await client.close()
    assert seen["requests"] == 2  # answered in part: not sent again
