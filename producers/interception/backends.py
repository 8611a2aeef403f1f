"""The two backends behind the interception server.

- EvalBackend: any OpenAI-compatible upstream (rlbus.clients.chat_client): from rlbus's own
  inference
  server, exact token ids, log-probs and the policy version (the server renders each prompt
  itself); from any other, the messages and usage, log-probs only when asked for and offered.
- TokenBackend: the inference server's token-in/token-out `/v1/generate`. Prompts are rendered
  once, then each turn extends the branch's recorded prompt + completion ids with the new
  messages (renderer.extend): sampled tokens are never decoded and re-tokenized. With several
  inference replicas, each rollout's route picks one (rlbus.clients.replicas).

Each answers a call whole (`complete`) or as it is sampled (`stream`: the message's text in
pieces, then the same CallResult `complete` returns). The token backend streams text only for
calls without tools: with tools, the text may hold a tool call that only the renderer's parse
of the whole completion tells apart.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import msgspec

from rlbus.clients.chat_client import ChatAnswer, ChatClient, ChatError
from rlbus.clients.inference_client import InferenceError
from rlbus.clients.replicas import Replicas, Roster, Route
from rlbus.clients.token_api import Delta, GenerateResult, SamplingParams
from rlbus.config.env import ModelConfig
from rlbus.producers.interception.calls import CallResult, ModelCall, Prior, UpstreamError
from rlbus.producers.interception.openai_messages import assistant_message


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
        self.chat = ChatClient(
            config.base_url,
            config.name,
            timeout_s=config.timeout_s,
            api_key_env=config.api_key_env,
        )

    def _sampling(self, call: ModelCall) -> dict[str, Any]:
        return {
            "tools": call.tools,
            "logprobs": call.logprobs,
            "temperature": call.temperature,
            "top_p": call.top_p,
            "max_tokens": call.max_tokens,
            "stop": call.stop,
            "seed": call.seed,
        }

    def _result(self, answer: ChatAnswer) -> CallResult:
        raw = answer.message
        message = assistant_message(raw.get("content"), raw.get("tool_calls"))
        return CallResult(
            message,
            _finish(answer.finish_reason, message),
            answer.model,
            prompt_tokens=answer.prompt_tokens,
            completion_tokens=answer.completion_tokens,
            prompt_ids=answer.prompt_ids,
            completion_ids=answer.completion_ids,
            logprobs=answer.logprobs,
            policy_version=answer.policy_version,
        )

    async def complete(
        self, call: ModelCall, prior: Prior | None, route: Route | None = None
    ) -> CallResult:
        try:
            answer = await self.chat.complete(call.messages, **self._sampling(call))
        except ChatError as exc:
            raise UpstreamError(f"upstream {exc}", exc.status) from exc
        return self._result(answer)

    async def stream(
        self, call: ModelCall, prior: Prior | None, route: Route | None = None
    ) -> AsyncGenerator[str | CallResult]:
        try:
            async for piece in self.chat.stream(call.messages, **self._sampling(call)):
                yield piece if isinstance(piece, str) else self._result(piece)
        except ChatError as exc:
            raise UpstreamError(f"upstream {exc}", exc.status) from exc

    async def close(self) -> None:
        await self.chat.close()


def renderer_for(config: ModelConfig) -> Any:
    """Train mode's renderer, from model.tokenizer: seconds to load (transformers imports torch),
    so a role loads it off its event loop."""
    if not config.tokenizer:
        raise ValueError(
            "train mode needs model.tokenizer (a model directory or hub id) to render prompts"
        )
    from transformers import AutoTokenizer

    from rlbus.clients.renderer import make_renderer

    return make_renderer(AutoTokenizer.from_pretrained(config.tokenizer), config.renderer)


class TokenBackend:
    mode = "train"

    def __init__(
        self, config: ModelConfig, renderer: Any | None = None, roster: Roster | None = None
    ):
        """`renderer`: anything with render/extend/parse (rlbus.clients.renderer);
        built from model.tokenizer when not given. `roster`: the run's replicas as they announce
        themselves (an env producer follows them on its bus); without it, the configured ones."""
        urls = [u for u in (config.base_url, *config.replica_urls) if u]
        if not urls and roster is None:
            raise ValueError("train mode needs model.base_url (the inference server's /v1 URL)")
        self.model = config.name
        self.renderer = renderer or renderer_for(config)
        self.replicas = Replicas(urls, roster or Roster(), config.timeout_s)

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
            # The template's end of turn, which the model's EOS need not be (ChatML's <|im_end|>
            # under a base model's <|endoftext|>).
            "stop_token_ids": list(self.renderer.stop_token_ids),
        }
        try:
            sampling = msgspec.convert(
                {k: v for k, v in chosen.items() if v is not None}, SamplingParams
            )
        except msgspec.ValidationError as exc:  # what the inference server answers with 400
            raise UpstreamError(f"bad sampling settings: {exc}", 400) from None
        return prompt_ids, sampling

    async def complete(
        self, call: ModelCall, prior: Prior | None, route: Route | None = None
    ) -> CallResult:
        prompt_ids, sampling = self._request(call, prior)
        try:
            out, replica = await self.replicas.call(
                route or Route(), lambda client: client.generate(prompt_ids, sampling)
            )
        except InferenceError as exc:
            raise UpstreamError(str(exc), exc.status) from exc
        return self._result(call, prompt_ids, out, replica)

    async def stream(
        self, call: ModelCall, prior: Prior | None, route: Route | None = None
    ) -> AsyncGenerator[str | CallResult]:
        prompt_ids, sampling = self._request(call, prior)
        out: GenerateResult | None = None
        replica = ""
        try:
            items = self.replicas.stream(route or Route(), prompt_ids, sampling)
            async for item, answered in items:
                replica = answered
                if isinstance(item, Delta):
                    if item.text and not call.tools:
                        yield item.text
                else:
                    out = item
        except InferenceError as exc:
            raise UpstreamError(str(exc), exc.status) from exc
        assert out is not None  # the client raises on a stream that ends without a result
        yield self._result(call, prompt_ids, out, replica)

    def _result(
        self, call: ModelCall, prompt_ids: list[int], out: GenerateResult, replica: str
    ) -> CallResult:
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
            replica=replica,
        )

    async def close(self) -> None:
        await self.replicas.close()


def make_backend(
    config: ModelConfig, renderer: Any | None = None, roster: Roster | None = None
) -> EvalBackend | TokenBackend:
    """`roster`: train mode's announced replicas (TokenBackend)."""
    if config.mode == "eval":
        return EvalBackend(config)
    return TokenBackend(config, renderer, roster)
