"""The chat client posts whole completions itself (on aiohttp, not through the openai client's
request machinery) and keeps what that machinery gave: a failed answer the endpoint may give
differently next time is asked again, a refusal is not, and both name the endpoint and status.
A real HTTP server on 127.0.0.1 that answers as scripted."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from rlbus.bus import free_port
from rlbus.bus.server_thread import ServerThread
from rlbus.clients.chat_client import ChatClient, ChatError

ANSWER = {
    "id": "c1",
    "object": "chat.completion",
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


class Answers:
    """An ASGI app answering each POST with the next (status, body) of its script."""

    def __init__(self, *script: tuple[int, Any]):
        self.script = list(script)
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[bytes, bytes]] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] == "GET":  # the model list: not rlbus's server
            status, body = 200, {"object": "list", "data": []}
        else:
            self.bodies.append(msgspec.json.decode(raw))
            self.headers.append(dict(scope["headers"]))
            status, body = self.script.pop(0)
        headers = [(b"content-type", b"application/json"), (b"retry-after", b"0")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": msgspec.json.encode(body)})


async def test_a_failed_answer_is_asked_again_and_the_answer_kept() -> None:
    busy, slow = (503, {"error": {"message": "busy"}}), (429, {"error": "slow down"})
    app = Answers(busy, slow, (200, ANSWER))
    with ServerThread(app) as server:
        client = ChatClient(f"{server.url}/v1", "m", max_retries=2)
        answer = await client.complete([{"role": "user", "content": "hi"}], temperature=0.5)
        await client.close()
    assert answer.message["content"] == "ok" and answer.completion_tokens == 1
    assert len(app.bodies) == 3
    assert app.bodies[0] == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
    }
    assert app.headers[0][b"authorization"].startswith(b"Bearer ")


async def test_a_refusal_is_not_asked_again_and_names_endpoint_and_status() -> None:
    app = Answers((404, {"error": {"message": "no model m"}}))
    with ServerThread(app) as server:
        client = ChatClient(f"{server.url}/v1", "m", max_retries=2)
        with pytest.raises(ChatError, match=r"/v1 answered 404: no model m") as refused:
            await client.complete([{"role": "user", "content": "hi"}])
        await client.close()
    assert refused.value.status == 404 and len(app.bodies) == 1


async def test_an_endpoint_that_keeps_failing_is_given_up_with_the_last_reason() -> None:
    app = Answers(*[(500, {"error": {"message": "boom"}})] * 2)
    with ServerThread(app) as server:
        client = ChatClient(f"{server.url}/v1", "m", max_retries=1)
        with pytest.raises(ChatError, match="answered 500: boom") as failed:
            await client.complete([{"role": "user", "content": "hi"}])
        await client.close()
    assert failed.value.status == 500 and len(app.bodies) == 2
    nobody = ChatClient(f"http://127.0.0.1:{free_port()}/v1", "m", max_retries=0)
    with pytest.raises(ChatError, match="failed") as unreachable:
        await nobody.complete([{"role": "user", "content": "hi"}])
    await nobody.close()
    assert unreachable.value.status == 502
