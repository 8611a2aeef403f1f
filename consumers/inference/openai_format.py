"""What the inference server adds to the OpenAI chat wire format (`rlbus.clients.openai_wire`):
the vLLM request extensions and the refusals, sampling settings from a request, log-probs
content from token ids, and the policy versions of the weights that sampled.

Extensions over OpenAI's shape, ignored by OpenAI clients but read by rlbus: every response
carries `policy_version` (plus `min_policy_version` / `max_policy_version`); with
`return_token_ids: true` (vLLM's name for it) the response also carries `prompt_token_ids`
and each choice its `token_ids`. `stop_token_ids` and `ignore_eos` are accepted as in vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlbus.clients import openai_wire as wire
from rlbus.consumers.inference.api import (
    Delta,
    GenerateResult,
    RequestError,
    SamplingParams,
    TopLogprob,
)

TokenText = Callable[[int], str]


class InferenceChatRequest(wire.ChatRequest, kw_only=True):
    """A chat request as this server takes it: a model name, vLLM's extensions, and refusals
    of what it cannot honour."""

    # kw_only: a required field may follow the parent's defaulted ones (pyright reads it as a
    # dataclass, where it may not)
    model: str  # pyright: ignore[reportGeneralTypeIssues]
    return_token_ids: bool = False
    stop_token_ids: list[int] = []
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
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


def sampling_params(
    req: InferenceChatRequest, stop_token_ids: list[int], choice: int
) -> SamplingParams:
    """The sampling settings for choice `choice` of `req`; ValueError on bad values."""
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        max_tokens=req.max_output_tokens,
        stop=req.stop_sequences,
        # ignore_eos keeps sampling past the end of the turn, so the template's stop ids go too.
        stop_token_ids=[*req.stop_token_ids, *([] if req.ignore_eos else stop_token_ids)],
        ignore_eos=req.ignore_eos,
        # n choices with one seed must still differ from each other.
        seed=None if req.seed is None else req.seed + choice,
        top_logprobs=req.top_logprobs or 0,
    )


def request_error_body(exc: RequestError) -> dict[str, Any]:
    return wire.error_body(str(exc), param=exc.param, code=exc.code)


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


class ChatWriter:
    """The response bodies of one chat request: log-probs as OpenAI entries from token ids,
    token ids when asked, policy versions always."""

    def __init__(self, req: InferenceChatRequest, model: str, token_text: TokenText) -> None:
        self.req = req
        self.model = model
        self.token_text = token_text
        self.chunks = wire.Chunks(model)

    def _logprobs(
        self, ids: list[int], logprobs: list[float], tops: list[list[TopLogprob]] | None
    ) -> list[dict[str, Any]] | None:
        """OpenAI's `logprobs.content`, one entry per sampled token; None unless asked for."""
        if not self.req.logprobs:
            return None
        text = self.token_text
        return [
            wire.logprob_entry(
                text(token_id),
                logprob,
                [wire.logprob_entry(text(t.token_id), t.logprob) for t in tops[i]] if tops else [],
            )
            for i, (token_id, logprob) in enumerate(zip(ids, logprobs, strict=True))
        ]

    def response(
        self,
        prompt_ids: list[int],
        results: list[GenerateResult],
        messages: list[dict[str, Any]],
    ) -> dict[str, Any]:
        ids = self.req.return_token_ids
        choices = [
            wire.choice(
                index,
                message,
                wire.finish_reason(result.finish_reason, message),
                self._logprobs(result.completion_ids, result.logprobs, result.top_logprobs),
                **({"token_ids": result.completion_ids} if ids else {}),
            )
            for index, (result, message) in enumerate(zip(results, messages, strict=True))
        ]
        completion_tokens = sum(len(r.completion_ids) for r in results)
        return wire.completion(
            wire.new_id(),
            self.model,
            choices,
            wire.usage(len(prompt_ids), completion_tokens),
            **version_fields(results),
            **({"prompt_token_ids": prompt_ids} if ids else {}),
        )

    def opening(self) -> dict[str, Any]:
        return self.chunks.chunk({"role": "assistant", "content": ""})

    def delta(self, item: Delta, *, with_text: bool) -> dict[str, Any] | None:
        logprobs = self._logprobs(item.token_ids, item.logprobs, item.top_logprobs)
        text = item.text if with_text else ""
        ids = self.req.return_token_ids
        if not text and logprobs is None and not ids:
            return None
        extra: dict[str, Any] = {"token_ids": item.token_ids} if ids else {}
        return self.chunks.chunk({"content": text} if text else {}, logprobs=logprobs, **extra)

    def closing(
        self,
        prompt_ids: list[int],
        result: GenerateResult,
        message: dict[str, Any],
        *,
        final_message: bool,
    ) -> dict[str, Any]:
        """The last choice chunk; with tools it holds the whole parsed message (no text deltas).
        It carries the versions that sampled, and the prompt's ids when token ids were asked for
        (the completion's came with the deltas)."""
        extra: dict[str, Any] = version_fields([result])
        if self.req.return_token_ids:
            extra["prompt_token_ids"] = prompt_ids
        return self.chunks.chunk(
            wire.message_delta(message) if final_message else {},
            finish=wire.finish_reason(result.finish_reason, message),
            **extra,
        )

    def usage(self, prompt_tokens: int, result: GenerateResult) -> dict[str, Any]:
        return self.chunks.usage(wire.usage(prompt_tokens, len(result.completion_ids)))
