"""The OpenAI chat-completions wire format, written once: the request as a typed struct, the
response body, streamed chunks as server-sent events, usage and error bodies, the model list.

The inference server, the interception server and the scripted test server (`tests/support`)
all speak it through this module and add only what is theirs: the inference server its
log-probs, token ids and policy versions, the interception server its Request/WireFormat
adapter. Pure functions and structs, no I/O.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec

Message = dict[str, Any]
"""A chat message, OpenAI shape: role, content, and tool_calls or tool_call_id."""

DONE = b"data: [DONE]\n\n"
"""The last event of an OpenAI stream."""


class ChatRequest(msgspec.Struct, kw_only=True):
    """The fields of a chat-completions request that rlbus reads; others are ignored. Servers
    that refuse some of them (the inference server) subclass this and check in __post_init__."""

    model: str | None = None
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    logprobs: bool | None = None
    top_logprobs: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.messages:
            raise ValueError("messages must not be empty")

    @property
    def active_tools(self) -> list[dict[str, Any]] | None:
        return None if self.tool_choice == "none" else self.tools

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    @property
    def max_output_tokens(self) -> int | None:
        """max_completion_tokens, or the older max_tokens."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def stop_sequences(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One OpenAI function call of an assistant message (`arguments`: JSON text)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def finish_reason(reason: str, message: Message) -> str:
    """OpenAI names a turn that stopped on tool calls `tool_calls`."""
    if reason == "stop" and message.get("tool_calls"):
        return "tool_calls"
    return reason


def logprob_entry(
    token: str, logprob: float, top: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """One entry of `choices[].logprobs.content`; `top` is a list of entries without their own."""
    entry: dict[str, Any] = {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    if top is not None:
        entry["top_logprobs"] = top
    return entry


def _logprobs(content: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return {"content": content} if content is not None else None


def choice(
    index: int,
    message: Message,
    finish: str,
    logprobs: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One choice of a non-streamed completion; `logprobs`: its content entries, when asked."""
    return {
        "index": index,
        "message": message,
        "logprobs": _logprobs(logprobs),
        "finish_reason": finish,
        **extra,
    }


def completion(
    response_id: str,
    model: str,
    choices: list[dict[str, Any]],
    token_usage: dict[str, int],
    **extra: Any,
) -> dict[str, Any]:
    """A `chat.completion` body; `extra`: fields a server adds beside OpenAI's."""
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": token_usage,
        **extra,
    }


def message_delta(message: Message) -> dict[str, Any]:
    """A whole assistant message as one streamed delta (tool calls get their stream index)."""
    delta: dict[str, Any] = {"content": message.get("content")}
    if calls := message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
    return delta


class Chunks:
    """Builds the `chat.completion.chunk` objects of one streamed completion (one choice)."""

    def __init__(self, model: str, response_id: str | None = None) -> None:
        self.id = response_id or new_id()
        self.model = model
        self.created = int(time.time())

    def _base(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def chunk(
        self,
        delta: dict[str, Any],
        *,
        logprobs: list[dict[str, Any]] | None = None,
        finish: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """A chunk of choice 0; `extra`: fields a server adds beside OpenAI's."""
        payload = {
            "index": 0,
            "delta": delta,
            "logprobs": _logprobs(logprobs),
            "finish_reason": finish,
        }
        return self._base([payload], **extra)

    def usage(self, token_usage: dict[str, int]) -> dict[str, Any]:
        """The closing usage chunk (sent when the request set stream_options.include_usage)."""
        return self._base([], usage=token_usage)


def whole_stream(
    chunks: Chunks, message: Message, finish: str, token_usage: dict[str, int] | None
) -> Iterator[bytes]:
    """A finished completion as a stream: the whole message, the finish, usage if asked, DONE."""
    yield sse(chunks.chunk({"role": "assistant", **message_delta(message)}))
    yield sse(chunks.chunk({}, finish=finish))
    if token_usage is not None:
        yield sse(chunks.usage(token_usage))
    yield DONE


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event carrying `data` as JSON (OpenAI's streams name no event)."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + msgspec.json.encode(data) + b"\n\n"


def error_body(
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_kind(status: int) -> str:
    return "invalid_request_error" if status < 500 else "api_error"


def model_list(names: list[str], created: int = 0) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "rlbus"} for n in names
        ],
    }
