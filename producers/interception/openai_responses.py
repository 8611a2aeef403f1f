"""OpenAI /v1/responses: input items become chat messages; the answer becomes output items."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from rlbus.clients.openai_wire import error_body, error_kind, sse, tool_call
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

_ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}


def _messages(body: dict[str, Any]) -> list[Message]:
    messages: list[Message] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("input must be a string or a non-empty list of items")
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(item.get("role", ""))
            if role is None:
                raise BadRequest(f"unsupported input role {item.get('role')!r}")
            messages.append({"role": role, "content": text_of(item.get("content"))})
        elif kind == "function_call":
            call = tool_call(item["call_id"], item["name"], item.get("arguments", "{}"))
            last = messages[-1] if messages else None
            # A response's text and calls come back as separate items: one assistant turn.
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item["call_id"],
                    "content": output if isinstance(output, str) else text_of(output),
                }
            )
        elif kind != "reasoning":
            raise BadRequest(f"unsupported input item type {kind!r}")
    return messages


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    return function_tools(body.get("tools"), "parameters", lambda t: t.get("type") == "function")


class OpenAIResponses:
    name = "openai"

    def parse(self, body: dict[str, Any]) -> Request:
        call = ModelCall(
            messages=_messages(body),
            tools=None if body.get("tool_choice") == "none" else _tools(body),
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            max_tokens=body.get("max_output_tokens"),
            continues=body.get("previous_response_id"),
        )
        return Request(call, bool(body.get("stream")))

    @staticmethod
    def _items(result: CallResult, response_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        content = result.message.get("content")
        if content:
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{response_id}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
                    ],
                }
            )
        for i, call in enumerate(result.message.get("tool_calls") or []):
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{response_id}_{i}",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                    "status": "completed",
                }
            )
        return items

    def _response(
        self, request: Request, result: CallResult | None, response_id: str
    ) -> dict[str, Any]:
        done = result is not None
        incomplete = done and result.finish_reason == "length"
        return {
            "id": f"resp_{response_id}",
            "object": "response",
            "created_at": int(time.time()),
            "status": ("incomplete" if incomplete else "completed") if done else "in_progress",
            "model": result.model if result else "",
            "output": self._items(result, response_id) if result else [],
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None,
            "instructions": None,
            "metadata": {},
            "parallel_tool_calls": True,
            "temperature": request.call.temperature,
            "top_p": request.call.top_p,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "usage": {
                "input_tokens": result.prompt_tokens,
                "output_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            }
            if result
            else None,
        }

    def respond(self, request: Request, result: CallResult, response_id: str) -> dict[str, Any]:
        return self._response(request, result, response_id)

    async def events(
        self, request: Request, model: str, pieces: Pieces, response_id: str
    ) -> AsyncIterator[bytes]:
        seq = iter(range(1 << 30))

        def event(kind: str, **fields: Any) -> bytes:
            return sse({"type": kind, "sequence_number": next(seq), **fields}, event=kind)

        message_id = f"msg_{response_id}"
        where = {"item_id": message_id, "output_index": 0}
        opened = False

        def open_message() -> Iterator[bytes]:
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item = {"type": "message", "id": message_id, "status": "in_progress"}
            yield event(
                "response.output_item.added",
                output_index=0,
                item={**item, "role": "assistant", "content": []},
            )
            yield event("response.content_part.added", **where, content_index=0, part=part)

        def text_delta(text: str) -> bytes:
            return event(
                "response.output_text.delta", **where, content_index=0, delta=text, logprobs=[]
            )

        yield event("response.created", response=self._response(request, None, response_id))
        sent: list[str] = []
        async for piece in pieces:
            if isinstance(piece, str):
                if not opened:
                    opened = True
                    for opening in open_message():
                        yield opening
                sent.append(piece)
                yield text_delta(piece)
                continue
            result = piece
        items = self._items(result, response_id)
        for index, item in enumerate(items):
            if item["type"] == "message":
                part = item["content"][0]
                if not opened:
                    for opening in open_message():
                        yield opening
                if rest := unsent(part["text"], "".join(sent)):
                    yield text_delta(rest)
                yield event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
                yield event("response.content_part.done", **where, content_index=0, part=part)
            else:
                at = {"item_id": item["id"], "output_index": index}
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""},
                )
                yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
                yield event(
                    "response.function_call_arguments.done",
                    **at,
                    arguments=item["arguments"],
                    name=item["name"],
                )
            yield event("response.output_item.done", output_index=index, item=item)
        final = self._response(request, result, response_id)
        # A completion cut at the token limit ends as the API ends it: response.incomplete.
        yield event(f"response.{final['status']}", response=final)

    def error(self, status: int, message: str) -> dict[str, Any]:
        return error_body(message, kind=error_kind(status))

    def stream_error(self, status: int, message: str) -> bytes:
        body = {"type": "error", "code": error_kind(status), "message": message, "param": None}
        return sse({**body, "sequence_number": 0}, event="error")
