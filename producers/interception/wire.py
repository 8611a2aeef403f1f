"""What each client protocol adapter provides; the server routes a path to one of them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from rlbus.producers.interception.calls import CallResult, ModelCall


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
    def events(self, request: Request, result: CallResult, response_id: str) -> Iterator[bytes]: ...
    def error(self, status: int, message: str) -> dict[str, Any]: ...


class BadRequest(ValueError):
    """A request the protocol adapter cannot turn into a model call."""
