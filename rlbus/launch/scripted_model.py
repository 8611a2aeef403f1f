"""A scripted model server on loopback that speaks OpenAI chat completions and token-in/token-out
`/v1/generate`, answering from a Python function instead of a model.

Tests and benchmarks point real clients (and the interception server) at it, so nothing but
the remote LLM is faked. It speaks the wire formats through the same modules as the real
servers (`rlbus.clients.openai_wire`, `rlbus.clients.token_api`); a raw ASGI app keeps it cheap
enough to stand in for an instant model.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import uvicorn

from rlbus.bus import free_port
from rlbus.bus.server_thread import ServerThread
from rlbus.bus.waiting import wait_for
from rlbus.clients import openai_wire as wire
from rlbus.clients.token_api import GenerateRequest, GenerateResult
from rlbus.schemas.chat import text_of

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


Answer = tuple[int, Any]
"""A status and a JSON body, or 200 and an iterator of server-sent events."""


def _chat(s: ScriptedModel, body: dict[str, Any]) -> Answer:
    req = msgspec.convert(body, wire.ChatRequest)
    reply = s.chat(req.messages, req.tools)
    content = reply.get("content")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reply.get("tool_calls"):
        message["tool_calls"] = reply["tool_calls"]
    finish = reply.get("finish_reason") or wire.finish_reason("stop", message)
    # Characters stand in for tokens.
    usage = wire.usage(
        sum(len(text_of(m.get("content"))) for m in req.messages), max(1, len(content or ""))
    )
    if req.stream:
        chunks = wire.Chunks(s.model)
        return 200, wire.whole_stream(chunks, message, finish, usage if req.include_usage else None)
    logprobs = [wire.logprob_entry(ch, -0.5, []) for ch in content or ""] if req.logprobs else None
    choice = wire.choice(0, message, finish, logprobs)
    return 200, wire.completion(wire.new_id(), s.model, [choice], usage)


def _generate(s: ScriptedModel, body: dict[str, Any]) -> Answer:
    req = msgspec.convert(body, GenerateRequest)
    ids = s.tokens(req.prompt_ids)
    version = s.policy_version
    return 200, GenerateResult(
        completion_ids=ids,
        logprobs=[-0.25] * len(ids),
        finish_reason="stop",
        prompt_tokens=len(req.prompt_ids),
        policy_version=version,
        min_policy_version=version,
        max_policy_version=version,
    )


class ScriptedApp:
    """The ASGI app answering for a ScriptedModel."""

    def __init__(self, scripted: ScriptedModel):
        self.s = scripted

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        raw = b""
        more = True
        while more:
            message = await receive()
            raw += message.get("body", b"")
            more = message.get("more_body", False)
        status, body = await self._route(scope["method"], scope["path"], raw)
        events = isinstance(body, Iterator)
        media_type = b"text/event-stream" if events else b"application/json"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", media_type)],
            }
        )
        for event in body if events else ():
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send(
            {"type": "http.response.body", "body": b"" if events else msgspec.json.encode(body)}
        )

    async def _route(self, method: str, path: str, raw: bytes) -> Answer:
        s = self.s
        if method == "GET" and path.endswith("/models"):
            return 200, wire.model_list([s.model])
        if method != "POST" or not path.endswith(("/chat/completions", "/generate")):
            return 404, wire.error_body(f"no route {method} {path}", kind="not_found_error")
        try:
            body = msgspec.json.decode(raw)
            if s.record:
                s.calls.append(body)
            if delay := s.delay():
                await asyncio.sleep(delay)
            return _chat(s, body) if path.endswith("/completions") else _generate(s, body)
        except msgspec.DecodeError as exc:  # bad JSON, or a body the struct refuses
            return 400, wire.error_body(str(exc))


class ScriptedServer(ServerThread):
    def __init__(self, scripted: ScriptedModel | None = None):
        self.model = scripted or ScriptedModel()
        super().__init__(ScriptedApp(self.model), name="scripted-model")

    def __enter__(self) -> ScriptedServer:
        super().__enter__()
        return self


def serve_scripted(scripted: ScriptedModel, port: int) -> None:
    """Serve `scripted` on 127.0.0.1:`port` in the foreground (benchmarks run it in a child
    process, so that it does not share the measured process's CPU)."""
    uvicorn.run(
        ScriptedApp(scripted),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        access_log=False,
    )


def serve_in_child(code: str, timeout_s: float = 60) -> tuple[subprocess.Popen[bytes], str]:
    """Run `code` (Python that ends in `serve_scripted(..., int(sys.argv[1]))`) in a child
    process on a free loopback port; returns the process and the server's /v1 URL once it
    answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", code, str(port)])
    url = f"http://127.0.0.1:{port}/v1"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the scripted server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5):
                return True
        except OSError:
            return False

    try:
        wait_for(up, timeout_s, f"the scripted server at {url}", interval_s=0.1)
    except BaseException:
        proc.kill()
        raise
    return proc, url
