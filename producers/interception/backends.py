"""The two backends behind the interception server.

- EvalBackend: any OpenAI-compatible upstream through the official `openai` client; token ids
  are unknown, log-probs only when asked for and offered.
- TokenBackend: the inference server's token-in/token-out `/v1/generate`. Prompts are rendered
  once, then each turn extends the branch's recorded prompt + completion ids with the new
  messages (renderer.extend): sampled tokens are never decoded and re-tokenized.

Each answers a call whole (`complete`) or as it is sampled (`stream`: the message's text in
pieces, then the same CallResult `complete` returns). The token backend streams text only for
calls without tools: with tools, the text may hold a tool call that only the renderer's parse
of the whole completion tells apart.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import openai

from rlbus.clients.inference import InferenceClient, InferenceError
from rlbus.clients.token_api import Delta, GenerateResult, SamplingParams
from rlbus.config.env import ModelConfig
from rlbus.producers.interception.calls import CallResult, ModelCall, Prior, UpstreamError
from rlbus.producers.interception.messages import assistant_message, tool_call


def _finish(reason: str | None, message: dict[str, Any]) -> str:
    if reason == "length":
        return "length"
    return "tool_calls" if message.get("tool_calls") else "stop"


class EvalBackend:
    mode = "eval"

    def __init__(self, config: ModelConfig):
        if not config.base_url:
            raise ValueError("eval mode needs model.base_url (an OpenAI-compatible /v1 URL)")
        self.model = config.name
        # The client's own HTTP stack over aiohttp: its default httpx transport cost `rlbus
        # eval` a third of its rate (bench/eval.py), and one client is enough (httpx needed
        # four, its pool checking every connection on each request).
        self.client = openai.AsyncOpenAI(
            base_url=config.base_url,
            timeout=config.timeout_s,
            api_key=os.environ.get(config.api_key_env) or "rlbus-local",
            http_client=openai.DefaultAioHttpClient(timeout=config.timeout_s),
        )

    def _arguments(self, call: ModelCall) -> dict[str, Any]:
        optional = {
            "tools": call.tools,
            "temperature": call.temperature,
            "top_p": call.top_p,
            "max_tokens": call.max_tokens,
            "stop": call.stop,
            "seed": call.seed,
            "logprobs": call.logprobs or None,
        }
        return {
            "model": self.model,
            "messages": call.messages,
            **{k: v for k, v in optional.items() if v is not None},
        }

    def _upstream_error(self, exc: openai.APIError) -> UpstreamError:
        if isinstance(exc, openai.APIStatusError):
            return UpstreamError(
                f"upstream {self.client.base_url} answered {exc.status_code}: {exc.message}",
                exc.status_code,
            )
        return UpstreamError(f"upstream {self.client.base_url} failed: {exc}")

    async def complete(self, call: ModelCall, prior: Prior | None) -> CallResult:
        try:
            # The raw response skips building the client's pydantic models: the interception
            # server only needs a few fields, and parsing is most of the client's cost per call.
            raw = await self.client.chat.completions.with_raw_response.create(
                **self._arguments(call)
            )
        except openai.APIError as exc:
            raise self._upstream_error(exc) from exc
        body = msgspec.json.decode(raw.http_response.content)
        choice = body["choices"][0]
        raw_message = choice.get("message") or {}
        message = assistant_message(raw_message.get("content"), raw_message.get("tool_calls"))
        usage = body.get("usage") or {}
        logprobs = [t["logprob"] for t in ((choice.get("logprobs") or {}).get("content") or [])]
        return CallResult(
            message,
            _finish(choice.get("finish_reason"), message),
            body.get("model") or self.model,
            prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
            logprobs=logprobs,
        )

    async def stream(self, call: ModelCall, prior: Prior | None) -> AsyncIterator[str | CallResult]:
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        logprobs: list[float] = []
        finish, model, usage = None, self.model, None
        try:
            chunks = await self.client.chat.completions.create(
                **self._arguments(call), stream=True, stream_options={"include_usage": True}
            )
            async with chunks:
                async for chunk in chunks:
                    model = chunk.model or model
                    usage = chunk.usage or usage
                    for choice in chunk.choices[:1]:
                        delta = choice.delta
                        if delta.content:
                            text.append(delta.content)
                            yield delta.content
                        for piece in delta.tool_calls or []:
                            made = calls.setdefault(
                                piece.index, {"id": "", "name": "", "arguments": ""}
                            )
                            function = piece.function
                            made["id"] = piece.id or made["id"]
                            made["name"] += (function.name or "") if function else ""
                            made["arguments"] += (function.arguments or "") if function else ""
                        if choice.logprobs and choice.logprobs.content:
                            logprobs.extend(t.logprob for t in choice.logprobs.content)
                        finish = choice.finish_reason or finish
        except openai.APIError as exc:
            raise self._upstream_error(exc) from exc
        made_calls = [
            tool_call(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())
        ]
        message = assistant_message("".join(text) or None, made_calls or None)
        yield CallResult(
            message,
            _finish(finish, message),
            model,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            logprobs=logprobs,
        )

    async def close(self) -> None:
        await self.client.close()


class TokenBackend:
    mode = "train"

    def __init__(self, config: ModelConfig, renderer: Any | None = None):
        """`renderer`: anything with render/extend/parse (rlbus.clients.renderer);
        built from model.tokenizer when not given."""
        if not config.base_url:
            raise ValueError("train mode needs model.base_url (the inference server's /v1 URL)")
        self.model = config.name
        self.renderer = renderer or self._renderer(config)
        self.inference = InferenceClient(config.base_url, config.timeout_s)

    @staticmethod
    def _renderer(config: ModelConfig) -> Any:
        if not config.tokenizer:
            raise ValueError(
                "train mode needs model.tokenizer (a model directory or hub id) to render prompts"
            )
        from transformers import AutoTokenizer

        from rlbus.clients.renderer import make_renderer

        return make_renderer(AutoTokenizer.from_pretrained(config.tokenizer), config.renderer)

    def _request(self, call: ModelCall, prior: Prior | None) -> tuple[list[int], SamplingParams]:
        if prior is not None:
            prompt_ids = self.renderer.extend(
                prior.prompt_ids, prior.completion_ids, prior.new_messages, tools=call.tools
            )
        else:
            prompt_ids = self.renderer.render(call.messages, tools=call.tools)
        chosen = {
            "temperature": call.temperature,
            "top_p": call.top_p,
            "max_tokens": call.max_tokens,
            "stop": call.stop,
            "seed": call.seed,
        }
        try:
            sampling = msgspec.convert(
                {k: v for k, v in chosen.items() if v is not None}, SamplingParams
            )
        except msgspec.ValidationError as exc:  # what the inference server answers with 400
            raise UpstreamError(f"bad sampling settings: {exc}", 400) from None
        return prompt_ids, sampling

    async def complete(self, call: ModelCall, prior: Prior | None) -> CallResult:
        prompt_ids, sampling = self._request(call, prior)
        try:
            out = await self.inference.generate(prompt_ids, sampling)
        except InferenceError as exc:
            raise UpstreamError(str(exc), exc.status) from exc
        return self._result(call, prompt_ids, out)

    async def stream(self, call: ModelCall, prior: Prior | None) -> AsyncIterator[str | CallResult]:
        prompt_ids, sampling = self._request(call, prior)
        out: GenerateResult | None = None
        try:
            async for item in self.inference.generate_stream(prompt_ids, sampling):
                if isinstance(item, Delta):
                    if item.text and not call.tools:
                        yield item.text
                else:
                    out = item
        except InferenceError as exc:
            raise UpstreamError(str(exc), exc.status) from exc
        assert out is not None  # the client raises on a stream that ends without a result
        yield self._result(call, prompt_ids, out)

    def _result(self, call: ModelCall, prompt_ids: list[int], out: GenerateResult) -> CallResult:
        message = self.renderer.parse(out.completion_ids, tools=call.tools, prompt_ids=prompt_ids)
        return CallResult(
            message,
            _finish(out.finish_reason, message),
            self.model,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(out.completion_ids),
            prompt_ids=prompt_ids,
            completion_ids=out.completion_ids,
            logprobs=out.logprobs,
            policy_version=out.policy_version,
        )

    async def close(self) -> None:
        await self.inference.close()


def make_backend(config: ModelConfig, renderer: Any | None = None) -> EvalBackend | TokenBackend:
    return EvalBackend(config) if config.mode == "eval" else TokenBackend(config, renderer)
