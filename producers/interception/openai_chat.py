"""OpenAI /v1/chat/completions, streaming and not: the interception server's adapter over the
shared wire format (`rlbus.clients.openai_wire`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from rlbus.clients import openai_wire as wire
from rlbus.producers.interception.calls import CallResult, ModelCall
from rlbus.producers.interception.wire import Pieces, Request, unsent


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

    async def events(
        self, request: Request, model: str, pieces: Pieces, response_id: str
    ) -> AsyncIterator[bytes]:
        chunks = wire.Chunks(model, f"chatcmpl-{response_id}")
        yield wire.sse(chunks.chunk({"role": "assistant", "content": ""}))
        sent: list[str] = []
        async for piece in pieces:
            if isinstance(piece, str):
                sent.append(piece)
                yield wire.sse(chunks.chunk({"content": piece}))
                continue
            message = piece.message
            rest = wire.message_delta(message)
            rest["content"] = unsent(message.get("content"), "".join(sent)) or None
            if rest["content"] or rest.get("tool_calls"):
                yield wire.sse(chunks.chunk(rest))
            yield wire.sse(
                chunks.chunk({}, finish=piece.finish_reason, policy_version=piece.policy_version)
            )
            if request.include_usage:
                yield wire.sse(chunks.usage(self._usage(piece)))
        yield wire.DONE

    def error(self, status: int, message: str) -> dict[str, Any]:
        return wire.error_body(message, kind=wire.error_kind(status))

    def stream_error(self, status: int, message: str) -> bytes:
        return wire.sse(self.error(status, message))
