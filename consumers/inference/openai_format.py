"""OpenAI chat-completions wire format <-> the backend's types (pure functions, no I/O).

Extensions over OpenAI's shape, ignored by OpenAI clients but read by rlbus: every response
carries `policy_version` (plus `min_policy_version` / `max_policy_version`); with
`return_token_ids: true` (vLLM's name for it) the response also carries `prompt_token_ids`
and each choice its `token_ids`. `stop_token_ids` and `ignore_eos` are accepted as in vLLM.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from rlbus.consumers.inference.api import (
    Delta,
    GenerateResult,
    RequestError,
    SamplingParams,
    TopLogprob,
)

TokenText = Callable[[int], str]


class ChatRequest(msgspec.Struct, kw_only=True):
    """The fields of an OpenAI chat-completions request this server acts on; others are ignored."""

    model: str
    messages: list[dict[str, Any]]
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
    return_token_ids: bool = False
    stop_token_ids: list[int] = []
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.messages:
            raise ValueError("messages must not be empty")
        if not 1 <= self.n <= 16:
            raise ValueError(f"n must be in [1, 16], got {self.n}")
        if self.stream and self.n != 1:
            raise ValueError("n > 1 is not supported with stream")
        # Refused, not ignored: a caller relying on them would silently get other samples.
        if self.presence_penalty or self.frequency_penalty or self.logit_bias:
            raise ValueError("presence_penalty, frequency_penalty and logit_bias are not supported")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise ValueError("only response_format {type: text} is supported")
        if self.tool_choice not in (None, "auto", "none"):
            raise ValueError("tool_choice must be 'auto' or 'none'")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")

    @property
    def active_tools(self) -> list[dict[str, Any]] | None:
        return None if self.tool_choice == "none" else self.tools

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


def sampling_params(req: ChatRequest, stop_token_ids: list[int], choice: int) -> SamplingParams:
    """The sampling settings for choice `choice` of `req`; ValueError on bad values."""
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        max_tokens=req.max_completion_tokens
        if req.max_completion_tokens is not None
        else req.max_tokens,
        stop=stop,
        # ignore_eos keeps sampling past the end of the turn, so the template's stop ids go too.
        stop_token_ids=[*req.stop_token_ids, *([] if req.ignore_eos else stop_token_ids)],
        ignore_eos=req.ignore_eos,
        # n choices with one seed must still differ from each other.
        seed=None if req.seed is None else req.seed + choice,
        top_logprobs=req.top_logprobs or 0,
    )


def error_body(
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def request_error_body(exc: RequestError) -> dict[str, Any]:
    return error_body(str(exc), param=exc.param, code=exc.code)


def _entry(token_id: int, logprob: float, token_text: TokenText) -> dict[str, Any]:
    text = token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def logprobs_content(
    token_ids: list[int],
    logprobs: list[float],
    tops: list[list[TopLogprob]] | None,
    token_text: TokenText,
) -> list[dict[str, Any]]:
    """OpenAI's `choices[].logprobs.content`: one entry per sampled token."""
    out = []
    for i, (token_id, logprob) in enumerate(zip(token_ids, logprobs, strict=True)):
        entry = _entry(token_id, logprob, token_text)
        entry["top_logprobs"] = (
            [_entry(t.token_id, t.logprob, token_text) for t in tops[i]] if tops else []
        )
        out.append(entry)
    return out


def finish_reason(result: GenerateResult, message: dict[str, Any]) -> str:
    if result.finish_reason == "stop" and message.get("tool_calls"):
        return "tool_calls"
    return result.finish_reason


def cut_at_stop(message: dict[str, Any], result: GenerateResult) -> dict[str, Any]:
    """OpenAI returns the text before a stop string; ids and log-probs keep every token."""
    content = message.get("content")
    if isinstance(result.stop_reason, str) and isinstance(content, str):
        at = content.find(result.stop_reason)
        if at != -1:
            message = {**message, "content": content[:at]}
    return message


def version_fields(results: list[GenerateResult]) -> dict[str, int]:
    low = min(r.min_policy_version for r in results)
    return {
        "policy_version": low,
        "min_policy_version": low,
        "max_policy_version": max(r.max_policy_version for r in results),
    }


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def chat_response(
    req: ChatRequest,
    model: str,
    prompt_ids: list[int],
    results: list[GenerateResult],
    messages: list[dict[str, Any]],
    token_text: TokenText,
) -> dict[str, Any]:
    choices = []
    for index, (result, message) in enumerate(zip(results, messages, strict=True)):
        choice: dict[str, Any] = {
            "index": index,
            "message": message,
            "logprobs": {
                "content": logprobs_content(
                    result.completion_ids, result.logprobs, result.top_logprobs, token_text
                )
            }
            if req.logprobs
            else None,
            "finish_reason": finish_reason(result, message),
        }
        if req.return_token_ids:
            choice["token_ids"] = result.completion_ids
        choices.append(choice)
    completion_tokens = sum(len(r.completion_ids) for r in results)
    body: dict[str, Any] = {
        "id": new_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens,
        },
        **version_fields(results),
    }
    if req.return_token_ids:
        body["prompt_token_ids"] = prompt_ids
    return body


class ChunkWriter:
    """Builds the `chat.completion.chunk` objects of one streamed completion."""

    def __init__(self, req: ChatRequest, model: str, token_text: TokenText) -> None:
        self._req = req
        self._model = model
        self._token_text = token_text
        self._id = new_id()
        self._created = int(time.time())

    def _chunk(
        self,
        delta: dict[str, Any],
        *,
        logprobs: list[dict[str, Any]] | None = None,
        finish: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": {"content": logprobs} if logprobs is not None else None,
            "finish_reason": finish,
        }
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [choice],
            **extra,
        }

    def opening(self) -> dict[str, Any]:
        return self._chunk({"role": "assistant", "content": ""})

    def delta(self, item: Delta, *, with_text: bool) -> dict[str, Any] | None:
        logprobs = (
            logprobs_content(item.token_ids, item.logprobs, item.top_logprobs, self._token_text)
            if self._req.logprobs
            else None
        )
        text = item.text if with_text else ""
        if not text and logprobs is None:
            return None
        extra = {"token_ids": item.token_ids} if self._req.return_token_ids else {}
        return self._chunk({"content": text} if text else {}, logprobs=logprobs, **extra)

    def closing(
        self, result: GenerateResult, message: dict[str, Any], *, final_message: bool
    ) -> dict[str, Any]:
        """The last choice chunk; with tools it holds the whole parsed message (no text deltas)."""
        delta: dict[str, Any] = {}
        if final_message:
            delta = {"content": message.get("content")}
            if message.get("tool_calls"):
                delta["tool_calls"] = [
                    {"index": i, **call} for i, call in enumerate(message["tool_calls"])
                ]
        return self._chunk(delta, finish=finish_reason(result, message), **version_fields([result]))

    def usage(self, prompt_tokens: int, result: GenerateResult) -> dict[str, Any]:
        n = len(result.completion_ids)
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n,
                "total_tokens": prompt_tokens + n,
            },
        }


def model_list(names: list[str], created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "rlbus"} for n in names
        ],
    }
