"""What each client protocol adapter provides; the server routes a path to one of them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rlbus.producers.interception.calls import CallResult, ModelCall

Pieces = AsyncIterator[str | CallResult]
"""A call as it is sampled: pieces of the message's text, then the whole CallResult."""


@dataclass(frozen=True)
class Request:
    call: ModelCall
    stream: bool
    include_usage: bool = False


class WireFormat(Protocol):
    name: str
    """The OpenTelemetry gen_ai.provider.name the harness believes it talks to."""

    def parse(self, body: dict[str, Any]) -> Request: ...
    def respond(self, request: Request, result: CallResult, response_id: str) -> dict[str, Any]: ...
    def events(
        self, request: Request, model: str, pieces: Pieces, response_id: str
    ) -> AsyncIterator[bytes]:
        """The protocol's stream: text events as the pieces come, the rest at the result."""
        ...

    def error(self, status: int, message: str) -> dict[str, Any]: ...
    def stream_error(self, status: int, message: str) -> bytes:
        """The event that ends a stream which failed after it started."""
        ...


class BadRequest(ValueError):
    """A request the protocol adapter cannot turn into a model call."""


def unsent(content: str | None, sent: str) -> str:
    """The end of a message's text that its streamed pieces did not carry. Pieces are the
    text's start as sampled; should the whole message read otherwise, what was sent stands."""
    content = content or ""
    return content[len(sent) :] if content.startswith(sent) else ""


def function_tools(
    tools: list[dict[str, Any]] | None, schema: str, offered: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]] | None:
    """A protocol's tool list as the chat format's function tools (what the renderer takes):
    each tool `offered` keeps, its JSON schema under the protocol's key `schema`."""
    functions = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description") or "",
                "parameters": t.get(schema) or {"type": "object", "properties": {}},
            },
        }
        for t in tools or []
        if offered(t)
    ]
    return functions or None
