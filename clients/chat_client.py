"""One chat completion from any OpenAI-compatible endpoint, keeping everything the endpoint tells:
the message, usage and, from rlbus's own inference server, the exact prompt and completion token
ids, their log-probs and the policy version that sampled them.

rlbus's server is recognised by the policy-version header it puts on every response (asked once,
on its model list); only then are its extensions requested (`return_token_ids`), since other
endpoints may refuse unknown fields. The interception server's eval backend and LLM judges both
call models through here.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
import openai
from opentelemetry import propagate

from rlbus.clients.openai_wire import tool_call
from rlbus.schemas.events import UNKNOWN_POLICY_VERSION

_json = msgspec.json.Encoder()

RETRIED_STATUSES = frozenset({408, 409, 429})
"""Besides 5xx: the statuses a request is sent again for (as the openai client does)."""

POLICY_VERSION_HEADER = "x-rlbus-policy-version"
"""On every response of rlbus's inference server (rlbus.consumers.inference.server)."""


class ChatError(RuntimeError):
    """The endpoint could not be reached or answered an error; `status` 502 when unreachable."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


@dataclass
class ChatAnswer:
    message: dict[str, Any]
    """The assistant message as the endpoint sent it (content, tool_calls)."""
    finish_reason: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_ids: list[int] = field(default_factory=list)
    """rlbus's server only: the ids its chat template rendered."""
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """One per completion token: from rlbus's server always, from others when asked for."""
    policy_version: int = UNKNOWN_POLICY_VERSION
    """From rlbus's server; UNKNOWN_POLICY_VERSION from any endpoint that does not say."""
    seconds: float = 0.0
    """The request's wall time."""


class ChatClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float = 600,
        api_key_env: str = "OPENAI_API_KEY",
        max_retries: int = 2,
    ):
        """`base_url`: the endpoint's /v1 URL. The key is read from `api_key_env` (local servers
        need none)."""
        self.base_url = base_url
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        api_key = os.environ.get(api_key_env) or "rlbus-local"
        self._headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
        # Streams and the model list go through the openai client, on its aiohttp stack: its
        # default httpx transport cost `rlbus eval` much of its rate (bench/eval.py; the
        # figure is in docs/benchmarks.md).
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            timeout=timeout_s,
            max_retries=max_retries,
            api_key=api_key,
            http_client=openai.DefaultAioHttpClient(timeout=timeout_s),
        )
        self._session: aiohttp.ClientSession | None = None
        self._rlbus: bool | None = None
        self._probing = asyncio.Lock()

    async def rlbus_served(self) -> bool:
        """Whether the endpoint is rlbus's inference server. Decided by the first answer to
        GET /models; an endpoint that cannot be reached is asked again next time."""
        if self._rlbus is not None:  # decided: no lock (it is asked once per call)
            return self._rlbus
        async with self._probing:
            if self._rlbus is None:
                try:
                    raw = await self.client.models.with_raw_response.list()
                    self._rlbus = POLICY_VERSION_HEADER in raw.headers
                except openai.APIStatusError:  # it answers, but has no model list: not rlbus
                    self._rlbus = False
                except openai.APIError:
                    return False
            return self._rlbus

    async def _options(
        self, tools: list[dict[str, Any]] | None, logprobs: bool, sampling: dict[str, Any]
    ) -> tuple[bool, dict[str, Any], dict[str, str]]:
        """Whether the endpoint is rlbus's, the request's body fields and its extra headers."""
        rlbus = await self.rlbus_served()
        options = {k: v for k, v in sampling.items() if v is not None}
        if tools:
            options["tools"] = tools
        if logprobs or rlbus:
            options["logprobs"] = True
        headers: dict[str, str] = {}
        if rlbus:  # W3C trace context: rlbus's inference server continues the caller's trace
            propagate.inject(headers)
        return rlbus, options, headers

    def _error(self, exc: openai.APIError) -> ChatError:
        if isinstance(exc, openai.APIStatusError):
            return ChatError(
                f"{self.base_url} answered {exc.status_code}: {exc.message}", exc.status_code
            )
        return ChatError(f"{self.base_url} failed: {exc}")

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        logprobs: bool = False,
        **sampling: Any,
    ) -> ChatAnswer:
        """`sampling`: temperature, top_p, max_tokens, stop, seed (None values are left out)."""
        rlbus, options, headers = await self._options(tools, logprobs, sampling)
        if rlbus:
            options["return_token_ids"] = True
        body = _json.encode({"model": self.model, "messages": messages, **options})
        started = time.monotonic()
        raw = await self._post("/chat/completions", body, headers)
        seconds = time.monotonic() - started
        body = msgspec.json.decode(raw)
        choice = body["choices"][0]
        usage = body.get("usage") or {}
        entries = (choice.get("logprobs") or {}).get("content") or []
        return ChatAnswer(
            message=choice.get("message") or {},
            finish_reason=choice.get("finish_reason") or "stop",
            model=body.get("model") or self.model,
            prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
            prompt_ids=body.get("prompt_token_ids") or [],
            completion_ids=choice.get("token_ids") or [],
            logprobs=[entry["logprob"] for entry in entries],
            policy_version=body.get("policy_version", UNKNOWN_POLICY_VERSION),
            seconds=seconds,
        )

    async def stream(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        logprobs: bool = False,
        **sampling: Any,
    ) -> AsyncIterator[str | ChatAnswer]:
        """The completion as the endpoint streams it: each text delta as it comes, then the
        whole answer. From rlbus's server the chunks also carry the sampled ids, and the last
        one the prompt's ids and the policy version."""
        rlbus, options, headers = await self._options(tools, logprobs, sampling)
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        entries: list[float] = []
        ids: list[int] = []
        prompt_ids: list[int] = []
        version = UNKNOWN_POLICY_VERSION
        finish, model, usage = "stop", self.model, None
        started = time.monotonic()
        try:
            chunks = await self.client.chat.completions.create(
                model=self.model,
                # plain message dicts: openai's TypedDicts describe the same JSON
                messages=messages,  # type: ignore[arg-type]
                stream=True,
                stream_options={"include_usage": True},
                extra_headers=headers or None,
                extra_body={"return_token_ids": True} if rlbus else None,
                **options,
            )
            async with chunks:
                async for chunk in chunks:
                    model = chunk.model or model
                    usage = chunk.usage or usage
                    if rlbus and (extra := chunk.model_extra):
                        ids.extend(extra.get("token_ids") or ())
                        prompt_ids = extra.get("prompt_token_ids") or prompt_ids
                        version = extra.get("policy_version", version)
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
                            entries.extend(t.logprob for t in choice.logprobs.content)
                        finish = choice.finish_reason or finish
        except openai.APIError as exc:
            raise self._error(exc) from exc
        tool_calls = [
            tool_call(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())
        ]
        yield ChatAnswer(
            message={"content": "".join(text) or None, "tool_calls": tool_calls or None},
            finish_reason=finish,
            model=model,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            prompt_ids=prompt_ids,
            completion_ids=ids,
            logprobs=entries,
            policy_version=version,
            seconds=time.monotonic() - started,
        )

    async def _post(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        """POST encoded JSON and return the answer's bytes, sent again (with backoff) after a
        connection failure, a timeout, a 5xx or a status in RETRIED_STATUSES, up to
        `max_retries` times. A whole completion goes out on aiohttp directly: the openai
        client's request and response machinery costs several times aiohttp's own CPU per
        call (docs/benchmarks.md has the figures)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        url = self.base_url.rstrip("/") + path
        error = ChatError(f"{self.base_url} was not asked")
        for attempt in range(self.max_retries + 1):
            delay = min(0.5 * 2**attempt, 8.0) * (1 - 0.25 * random.random())
            try:
                async with self._session.post(
                    url, data=body, headers={**self._headers, **headers}
                ) as response:
                    raw = await response.read()
                    if response.status < 400:
                        return raw
                    error = ChatError(
                        f"{self.base_url} answered {response.status}: {_error_text(raw)}",
                        response.status,
                    )
                    if response.status < 500 and response.status not in RETRIED_STATUSES:
                        raise error
                    after = response.headers.get("retry-after", "")
                    if after.replace(".", "", 1).isdigit() and float(after) <= 60:
                        delay = float(after)
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = ChatError(f"{self.base_url} failed: {exc or type(exc).__name__}")
            if attempt < self.max_retries:
                await asyncio.sleep(delay)
        raise error

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self.client.close()


def _error_text(raw: bytes) -> str:
    """An error answer's message (OpenAI's `{"error": {"message": ...}}`), else its text."""
    try:
        body = msgspec.json.decode(raw)
        message = body["error"]["message"] if isinstance(body["error"], dict) else body["error"]
        return str(message)[:2000]
    except (msgspec.DecodeError, KeyError, TypeError):
        return raw[:2000].decode(errors="replace")
