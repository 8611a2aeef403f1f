"""Anthropic /v1/messages: content blocks to and from OpenAI-shaped messages."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from rlbus.clients.openai_wire import sse, tool_call
from rlbus.producers.interception.calls import CallResult, ModelCall
from rlbus.producers.interception.openai_messages import Message
from rlbus.producers.interception.wire import (
    BadRequest,
    Pieces,
    Request,
    function_tools,
    unsent,
)
from rlbus.schemas.chat import text_of

_TEXT_START = {"type": "text", "text": ""}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _text_delta(text: str) -> dict[str, str]:
    return {"type": "text_delta", "text": text}


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])


def _messages(body: dict[str, Any]) -> list[Message]:
    messages: list[Message] = []
    if system := text_of(body.get("system")):
        messages.append({"role": "system", "content": system})
    for turn in body.get("messages") or []:
        role, blocks = turn.get("role"), _blocks(turn.get("content"))
        if role == "assistant":
            calls = [
                tool_call(b["id"], b["name"], json.dumps(b.get("input") or {}))
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            message: Message = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
        elif role == "user":
            for block in blocks:
                if block.get("type") == "tool_result":
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": block["tool_use_id"],
                            "content": text_of(block.get("content")),
                        }
                    )
            text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            if text or not any(b.get("type") == "tool_result" for b in blocks):
                messages.append({"role": "user", "content": text})
        else:
            raise BadRequest(f"messages: role must be user or assistant, got {role!r}")
    if not any(m["role"] != "system" for m in messages):
        raise BadRequest("messages must not be empty")
    return messages


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    return function_tools(body.get("tools"), "input_schema", lambda t: "name" in t)


class AnthropicMessages:
    name = "anthropic"

    def parse(self, body: dict[str, Any]) -> Request:
        if not isinstance(body.get("max_tokens"), int):
            raise BadRequest("max_tokens: field required")
        choice = (body.get("tool_choice") or {}).get("type")
        call = ModelCall(
            messages=_messages(body),
            tools=None if choice == "none" else _tools(body),
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            max_tokens=body["max_tokens"],
            stop=body.get("stop_sequences"),
        )
        return Request(call, bool(body.get("stream")))

    @staticmethod
    def _content(result: CallResult) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if text := result.message.get("content"):
            blocks.append({"type": "text", "text": text})
        for call in result.message.get("tool_calls") or []:
            try:
                arguments = json.loads(call["function"]["arguments"] or "{}")
            except json.JSONDecodeError:
                arguments = {"_raw": call["function"]["arguments"]}
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": call["function"]["name"],
                    "input": arguments,
                }
            )
        return blocks

    @staticmethod
    def _message(
        result: CallResult, response_id: str, content: list[dict[str, Any]], final: bool
    ) -> dict[str, Any]:
        return {
            "id": f"msg_{response_id}",
            "type": "message",
            "role": "assistant",
            "model": result.model,
            "content": content,
            "stop_reason": _STOP_REASONS.get(result.finish_reason, "end_turn") if final else None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": result.prompt_tokens,
                "output_tokens": result.completion_tokens if final else 0,
            },
        }

    def respond(self, request: Request, result: CallResult, response_id: str) -> dict[str, Any]:
        return self._message(result, response_id, self._content(result), final=True)

    async def events(
        self, request: Request, model: str, pieces: Pieces, response_id: str
    ) -> AsyncIterator[bytes]:
        def event(kind: str, **fields: Any) -> bytes:
            return sse({"type": kind, **fields}, event=kind)

        opening = CallResult({"role": "assistant", "content": None}, "stop", model)
        yield event("message_start", message=self._message(opening, response_id, [], final=False))
        sent: list[str] = []
        async for piece in pieces:
            if isinstance(piece, str):
                if not sent:
                    yield event("content_block_start", index=0, content_block=_TEXT_START)
                sent.append(piece)
                yield event("content_block_delta", index=0, delta=_text_delta(piece))
                continue
            result = piece
        blocks = self._content(result)
        if sent and (not blocks or blocks[0]["type"] != "text"):
            blocks.insert(0, {"type": "text", "text": "".join(sent)})  # what was sent stands
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                if not sent:
                    yield event("content_block_start", index=index, content_block=_TEXT_START)
                if rest := unsent(block["text"], "".join(sent)):
                    yield event("content_block_delta", index=index, delta=_text_delta(rest))
            else:
                yield event(
                    "content_block_start", index=index, content_block={**block, "input": {}}
                )
                partial = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                yield event("content_block_delta", index=index, delta=partial)
            yield event("content_block_stop", index=index)
        yield event(
            "message_delta",
            delta={
                "stop_reason": _STOP_REASONS.get(result.finish_reason, "end_turn"),
                "stop_sequence": None,
            },
            usage={
                "input_tokens": result.prompt_tokens,
                "output_tokens": result.completion_tokens,
            },
        )
        yield event("message_stop")

    def error(self, status: int, message: str) -> dict[str, Any]:
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
        }.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def stream_error(self, status: int, message: str) -> bytes:
        return sse(self.error(status, message), event="error")
