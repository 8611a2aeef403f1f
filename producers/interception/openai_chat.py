"""OpenAI /v1/chat/completions, streaming and not: the interception server's adapter over the
shared wire format (`rlbus.clients.openai_wire`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from rlbus.clients import openai_wire as wire
from rlbus.producers.interception.calls import CallResult, ModelCall
from rlbus.producers.interception.wire import Request


class OpenAIChat:
    name = "openai"

    def parse(self, body: dict[str, Any]) -> Request:
        req = msgspec.convert(body, wire.ChatRequest)  # a ValidationError is a DecodeError: 400
        call = ModelCall(
            messages=req.messages,
            tools=req.active_tools or None,
            temperature=req.temperature,
            top_p=req.top_p,
            max_tokens=req.max_output_tokens,
            stop=req.stop_sequences or None,
            seed=req.seed,
            logprobs=bool(req.logprobs),
        )
        return Request(call, req.stream, req.include_usage)

    @staticmethod
    def _usage(result: CallResult) -> dict[str, int]:
        return wire.usage(result.prompt_tokens, result.completion_tokens)

    def respond(self, request: Request, result: CallResult, response_id: str) -> dict[str, Any]:
        return wire.completion(
            f"chatcmpl-{response_id}",
            result.model,
            [wire.choice(0, result.message, result.finish_reason)],
            self._usage(result),
            policy_version=result.policy_version,
        )

    def events(self, request: Request, result: CallResult, response_id: str) -> Iterator[bytes]:
        chunks = wire.Chunks(result.model, f"chatcmpl-{response_id}")
        usage = self._usage(result) if request.include_usage else None
        return wire.whole_stream(chunks, result.message, result.finish_reason, usage)

    def error(self, status: int, message: str) -> dict[str, Any]:
        return wire.error_body(message, kind=wire.error_kind(status))
