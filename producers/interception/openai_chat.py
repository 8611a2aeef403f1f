"""OpenAI /v1/chat/completions, streaming and not."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from rlbus.producers.interception.calls import CallResult, ModelCall
from rlbus.producers.interception.wire import BadRequest, Request, sse


def _stop(value: Any) -> list[str] | None:
    return [value] if isinstance(value, str) else value


class OpenAIChat:
    name = "openai"

    def parse(self, body: dict[str, Any]) -> Request:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        tools = None if body.get("tool_choice") == "none" else body.get("tools") or None
        call = ModelCall(
            messages=messages,
            tools=tools,
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
            stop=_stop(body.get("stop")),
            seed=body.get("seed"),
            logprobs=bool(body.get("logprobs")),
        )
        options = body.get("stream_options") or {}
        return Request(call, bool(body.get("stream")), bool(options.get("include_usage")))

    @staticmethod
    def _usage(result: CallResult) -> dict[str, int]:
        return {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
        }

    def respond(self, request: Request, result: CallResult, response_id: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{response_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": result.model,
            "policy_version": result.policy_version,
            "choices": [
                {
                    "index": 0,
                    "message": result.message,
                    "finish_reason": result.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": self._usage(result),
        }

    def events(self, request: Request, result: CallResult, response_id: str) -> Iterator[bytes]:
        base = {
            "id": f"chatcmpl-{response_id}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": result.model,
        }
        delta: dict[str, Any] = {"role": "assistant", "content": result.message.get("content")}
        if calls := result.message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        yield sse(
            {
                **base,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}],
            }
        )
        yield sse(
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {},
                        "finish_reason": result.finish_reason,
                        "logprobs": None,
                    }
                ],
            }
        )
        if request.include_usage:
            yield sse({**base, "choices": [], "usage": self._usage(result)})
        yield b"data: [DONE]\n\n"

    def error(self, status: int, message: str) -> dict[str, Any]:
        kind = "invalid_request_error" if status < 500 else "api_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}
