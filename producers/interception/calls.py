"""One model call as the interception server sees it, whatever protocol the harness spoke,
and the backend contract that answers it."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from rlbus.clients.replicas import Route
from rlbus.config.env import SamplingConfig
from rlbus.producers.interception.openai_messages import Message

Tools = list[dict[str, Any]] | None
"""OpenAI function tools: [{"type": "function", "function": {name, description, parameters}}]."""


@dataclass(frozen=True)
class ModelCall:
    messages: list[Message]
    tools: Tools = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    continues: str | None = None
    """The id of an earlier response whose conversation this call continues (the Responses API's
    previous_response_id); `messages` then hold only what is new (Trace.continued)."""

    def with_sampling(self, sampling: SamplingConfig) -> ModelCall:
        """The run's sampling settings win over the harness's wherever they are set."""
        chosen = {
            name: getattr(sampling, name)
            for name in ("temperature", "top_p", "max_tokens", "stop", "seed")
            if getattr(sampling, name) is not None
        }
        return replace(self, **chosen, logprobs=self.logprobs or sampling.logprobs)


@dataclass(frozen=True)
class Prior:
    """The branch a call continues: its last call's exact ids and the messages added since."""

    prompt_ids: list[int]
    completion_ids: list[int]
    new_messages: list[Message]


@dataclass
class CallResult:
    message: Message
    """The assistant message, OpenAI shape (content, tool_calls)."""
    finish_reason: str
    """OpenAI vocabulary: stop, length or tool_calls."""
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_ids: list[int] = field(default_factory=list)
    """Train mode: exactly what the backend was given (empty in eval mode)."""
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_version: int = 0
    replica: str = ""
    """Train mode: the inference replica that answered (its /v1 URL)."""


class UpstreamError(RuntimeError):
    """The backend failed a call; `status` is what the harness's client is answered with."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


class Backend(Protocol):
    mode: str
    model: str

    async def complete(
        self, call: ModelCall, prior: Prior | None, route: Route | None = None
    ) -> CallResult:
        """The call answered whole; `route`: the rollout's way to inference (train mode)."""
        ...

    def stream(
        self, call: ModelCall, prior: Prior | None, route: Route | None = None
    ) -> AsyncGenerator[str | CallResult]:
        """The message's text in pieces as it is sampled, then the whole CallResult."""
        ...

    async def close(self) -> None: ...
