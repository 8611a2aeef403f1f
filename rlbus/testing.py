"""A scripted model server on loopback: OpenAI chat completions and token-in/token-out
`/v1/generate`, answering from a Python function instead of a model.

Tests and benchmarks point real clients (and the interception server) at it, so nothing but
the remote LLM is faked. A raw ASGI app keeps it cheap enough to stand in for an instant model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import uvicorn

from rlbus.bus import free_port
from rlbus.schemas.messages import text_of

Reply = dict[str, Any]
"""An assistant message: {"content": str} and optionally "tool_calls" (OpenAI shape)."""
ChatScript = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], Reply]
TokenScript = Callable[[list[int]], list[int]]


def reverse_task_word(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Reply:
    """Answers reverse-text tasks correctly: the last word of the first user message, reversed."""
    user = next((m for m in messages if m.get("role") == "user"), {"content": ""})
    words = text_of(user.get("content")).split()
    return {"content": words[-1][::-1] if words else ""}


def echo_tokens(prompt_ids: list[int]) -> list[int]:
    """Token script: the last three prompt ids, then id 0."""
    return [*prompt_ids[-3:], 0]


@dataclass
class ScriptedModel:
    chat: ChatScript = reverse_task_word
    tokens: TokenScript = echo_tokens
    model: str = "scripted"
    policy_version: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Every request body received, for tests to inspect."""
    record: bool = True
    delay_s: float | Callable[[], float] = 0.0
    """Seconds each request waits before its answer, or a function drawing them per request
    (bench/async_rl.py draws heavy-tailed agent latencies)."""

    def delay(self) -> float:
        return self.delay_s() if callable(self.delay_s) else self.delay_s


def _completion(body: dict[str, Any], reply: Reply, model: str) -> dict[str, Any]:
    prompt_tokens = sum(len(text_of(m.get("content"))) for m in body["messages"])
    completion_tokens = max(1, len(reply.get("content") or ""))
    message = {"role": "assistant", "content": reply.get("content")}
    if reply.get("tool_calls"):
        message["tool_calls"] = reply["tool_calls"]
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": reply.get("finish_reason")
        or ("tool_calls" if reply.get("tool_calls") else "stop"),
    }
    if body.get("logprobs"):
        choice["logprobs"] = {
            "content": [
                {"token": ch, "logprob": -0.5, "bytes": list(ch.encode()), "top_logprobs": []}
                for ch in (reply.get("content") or "")
            ]
        }
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _chunks(completion: dict[str, Any]) -> Iterator[bytes]:
    choice = completion["choices"][0]
    base = {k: completion[k] for k in ("id", "created", "model")} | {
        "object": "chat.completion.chunk"
    }
    delta = {"role": "assistant", "content": choice["message"]["content"]}
    if choice["message"].get("tool_calls"):
        delta["tool_calls"] = [
            {"index": i, **c} for i, c in enumerate(choice["message"]["tool_calls"])
        ]
    for payload in (
        {"delta": delta, "finish_reason": None},
        {"delta": {}, "finish_reason": choice["finish_reason"]},
    ):
        yield (
            b"data: "
            + msgspec.json.encode({**base, "choices": [{"index": 0, **payload}]})
            + b"\n\n"
        )
    yield (
        b"data: "
        + msgspec.json.encode({**base, "choices": [], "usage": completion["usage"]})
        + b"\n\n"
    )
    yield b"data: [DONE]\n\n"


class _App:
    def __init__(self, scripted: ScriptedModel):
        self.s = scripted

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        raw = b""
        more = True
        while more:
            message = await receive()
            raw += message.get("body", b"")
            more = message.get("more_body", False)
        status, body = await self._route(scope["method"], scope["path"], raw)
        if isinstance(body, bytes | dict):
            data = body if isinstance(body, bytes) else msgspec.json.encode(body)
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": data})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        async for chunk in body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _route(
        self, method: str, path: str, raw: bytes
    ) -> tuple[int, dict[str, Any] | bytes | AsyncIterator[bytes]]:
        s = self.s
        if method == "GET" and path.endswith("/models"):
            return 200, {
                "object": "list",
                "data": [{"id": s.model, "object": "model", "created": 0, "owned_by": "rlbus"}],
            }
        if method != "POST":
            return 404, {"error": {"message": f"no route {method} {path}"}}
        body = msgspec.json.decode(raw)
        if s.record:
            s.calls.append(body)
        delay = s.delay()
        if delay:
            await asyncio.sleep(delay)
        if path.endswith("/chat/completions"):
            completion = _completion(body, s.chat(body["messages"], body.get("tools")), s.model)
            if not body.get("stream"):
                return 200, completion

            async def stream() -> AsyncIterator[bytes]:
                for chunk in _chunks(completion):
                    yield chunk

            return 200, stream()
        if path.endswith("/generate"):
            ids = s.tokens(body["prompt_ids"])
            return 200, {
                "completion_ids": ids,
                "logprobs": [-0.25] * len(ids),
                "finish_reason": "stop",
                "prompt_tokens": len(body["prompt_ids"]),
                "policy_version": s.policy_version,
                "min_policy_version": s.policy_version,
                "max_policy_version": s.policy_version,
            }
        return 404, {"error": {"message": f"no route {method} {path}"}}


class ThreadedServer:
    """Serve an ASGI app on 127.0.0.1 from a background thread (its own event loop), so a test's
    synchronous code and its asyncio code can both talk to it."""

    def __init__(self, app: Any, lifespan: str = "off", start_timeout_s: float = 60):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._start_timeout_s = start_timeout_s
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                lifespan=lifespan,
                access_log=False,
            )
        )
        self._thread = threading.Thread(
            target=self._server.run, daemon=True, name="threaded-server"
        )

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._server.force_exit = (
            True  # requests still in flight (a slow script) are not waited for
        )
        with contextlib.suppress(RuntimeError):
            self._thread.join(10)


class ScriptedServer(ThreadedServer):
    def __init__(self, scripted: ScriptedModel | None = None):
        self.model = scripted or ScriptedModel()
        super().__init__(_App(self.model))

    def __enter__(self) -> ScriptedServer:
        super().__enter__()
        return self


def _load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Serve a scripted OpenAI-compatible model on 127.0.0.1."
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--chat", default=f"{__name__}:reverse_task_word", help="module:function replying to chats"
    )
    args = parser.parse_args()
    scripted = ScriptedModel(chat=_load(args.chat), record=False)
    uvicorn.run(
        _App(scripted),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        lifespan="off",
        access_log=False,
    )


if __name__ == "__main__":
    main()
