"""HTTP front of an inference backend: OpenAI chat completions plus token-level endpoints.

Routes
  GET  /v1/models                 OpenAI model list
  POST /v1/chat/completions       OpenAI chat (stream or not, logprobs, tools, usage)
  POST /v1/generate               {prompt_ids, sampling} -> ids, log-probs, finish, versions
                                  (stream: `delta` events as tokens are sampled, then `result`)
  POST /v1/score                  {prompt_ids, completion_ids} -> completion log-probs (prefill)
                                  (`model`: one of the LoRA adapters it serves, or the model)
  POST /v1/weights                {uri, version} -> load a checkpoint now (what the bus worker does)
  GET  /v1/stats, /metrics        engine figures (mean batch size, tokens, versions) as JSON
  GET  /health

Every response carries `x-rlbus-policy-version`; results also carry it in the body. Client
mistakes get a 4xx with OpenAI's error JSON and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Any

import msgspec
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rlbus.bus import telemetry
from rlbus.clients import openai_wire as wire
from rlbus.clients.renderer import Renderer, RendererError
from rlbus.clients.token_api import DELTA, ERROR, RESULT, GenerateRequest, ScoreRequest
from rlbus.consumers.inference.api import (
    Delta,
    GenerateResult,
    InferenceBackend,
    RequestError,
    SamplingParams,
    WeightsRequest,
    check_prompt,
)
from rlbus.consumers.inference.checkpoint_reader import CheckpointError
from rlbus.consumers.inference.openai_format import (
    ChatWriter,
    InferenceChatRequest,
    cut_at_stop,
    request_error_body,
    sampling_params,
)

VERSION_HEADER = "x-rlbus-policy-version"
MAX_VERSION_HEADER = "x-rlbus-policy-version-max"


class UnknownModelError(RequestError):
    code = "model_not_found"
    param = "model"


OPERATIONS = {"/v1/chat/completions": "chat", "/v1/generate": "text_completion"}
"""GenAI operation names of the routes that sample."""


class _Traced:
    """A server span per sampling request, continuing the caller's trace (W3C headers: the
    interception server's model call), so a rollout's trace reaches inference; it spans a
    streamed response to its end. Nothing is done while telemetry is off."""

    def __init__(self, app: ASGIApp, model_name: str) -> None:
        self.app = app
        self.model_name = model_name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        operation = OPERATIONS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if operation is None or not telemetry.enabled():
            await self.app(scope, receive, send)
            return
        headers = [(k.decode("latin-1"), v) for k, v in scope.get("headers", ())]
        attributes = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "rlbus",
            "gen_ai.request.model": self.model_name,
        }
        parent = telemetry.extract_context(headers)
        name = f"{operation} {self.model_name}"
        with telemetry.span(name, SpanKind.SERVER, parent, attributes) as span:

            async def traced_send(message: Message) -> None:
                if message["type"] == "http.response.start" and span is not None:
                    span.set_attribute("http.response.status_code", message["status"])
                    for k, v in message.get("headers", ()):
                        if k == VERSION_HEADER.encode():
                            span.set_attribute("rlbus.policy_version", int(v))
                await send(message)

            await self.app(scope, receive, traced_send)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        msgspec.json.encode(body),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _result_headers(results: list[GenerateResult]) -> dict[str, str]:
    return {
        VERSION_HEADER: str(min(r.min_policy_version for r in results)),
        MAX_VERSION_HEADER: str(max(r.max_policy_version for r in results)),
    }


class _VersionHeader:
    """Adds the served policy version to responses that did not set a more precise one."""

    def __init__(self, app: ASGIApp, version: Callable[[], int]) -> None:
        self.app = app
        self.version = version

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name == VERSION_HEADER.encode() for name, _ in headers):
                    headers.append((VERSION_HEADER.encode(), str(self.version()).encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_header)


class InferenceAPI:
    """The route handlers, bound to one backend, renderer and served model name."""

    def __init__(
        self,
        backend: InferenceBackend,
        renderer: Renderer,
        token_text: Callable[[int], str],
        model_name: str,
        aliases: tuple[str, ...] = (),
    ) -> None:
        self.backend = backend
        self.renderer = renderer
        self.token_text = lru_cache(maxsize=1 << 16)(token_text)
        self.model_name = model_name
        self.names = (model_name, *aliases)
        self.created = int(time.time())

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.names:
            adapters = self.backend.adapters
            scoring = f" (and scores with adapters {', '.join(adapters)})" if adapters else ""
            raise UnknownModelError(
                f"model {model!r} does not exist; this server serves {self.model_name!r}" + scoring
            )

    def adapter_of(self, model: str | None) -> str | None:
        """The adapter a score request names as its `model`; None for the served model."""
        if model in self.backend.adapters:
            return model
        self.check_model(model)
        return None

    async def models(self, request: Request) -> Response:
        return _json(wire.model_list([self.model_name, *self.backend.adapters], self.created))

    async def health(self, request: Request) -> Response:
        return _json({"status": "ok", "policy_version": self.backend.policy_version})

    async def stats(self, request: Request) -> Response:
        return _json(self.backend.stats())

    async def generate(self, request: Request) -> Response:
        req = msgspec.json.decode(await request.body(), type=GenerateRequest)
        self.check_model(req.model)
        if req.stream:
            # Checked here, so that a bad prompt is refused with a status code, not an event.
            check_prompt(req.prompt_ids, self.backend.vocab_size, self.backend.max_context)
            return StreamingResponse(
                self._generate_stream(req.prompt_ids, req.sampling),
                media_type="text/event-stream",
            )
        result = await self.backend.generate(req.prompt_ids, req.sampling, text=req.return_text)
        return _json(result, headers=_result_headers([result]))

    async def _generate_stream(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> AsyncIterator[bytes]:
        try:
            async for item in self.backend.stream(prompt_ids, sampling):
                yield wire.sse(item, event=DELTA if isinstance(item, Delta) else RESULT)
        except RequestError as exc:
            yield wire.sse(request_error_body(exc), event=ERROR)

    async def score(self, request: Request) -> Response:
        req = msgspec.json.decode(await request.body(), type=ScoreRequest)
        adapter = self.adapter_of(req.model)
        result = await self.backend.score(
            req.prompt_ids, req.completion_ids, req.temperature, adapter
        )
        return _json(result, headers={VERSION_HEADER: str(result.policy_version)})

    async def weights(self, request: Request) -> Response:
        req = msgspec.json.decode(await request.body(), type=WeightsRequest)
        seconds = await self.backend.load_weights(req.uri, req.version)
        return _json({"version": req.version, "load_s": seconds})

    async def chat(self, request: Request) -> Response:
        req = msgspec.json.decode(await request.body(), type=InferenceChatRequest)
        self.check_model(req.model)
        tools = req.active_tools
        prompt_ids = self.renderer.render(req.messages, tools=tools)
        # Checked here too, so that a stream is refused with a status code, not an error event.
        check_prompt(prompt_ids, self.backend.vocab_size, self.backend.max_context)
        try:
            params = [sampling_params(req, self.renderer.stop_token_ids, i) for i in range(req.n)]
        except ValueError as exc:
            raise RequestError(str(exc)) from exc
        if req.stream:
            return StreamingResponse(
                self._stream(req, prompt_ids, params[0]), media_type="text/event-stream"
            )
        results = await asyncio.gather(*(self.backend.generate(prompt_ids, p) for p in params))
        messages = [
            cut_at_stop(
                self.renderer.parse(r.completion_ids, tools=tools, prompt_ids=prompt_ids), r
            )
            for r in results
        ]
        body = ChatWriter(req, self.model_name, self.token_text).response(
            prompt_ids, results, messages
        )
        return _json(body, headers=_result_headers(results))

    async def _stream(
        self, req: InferenceChatRequest, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[bytes]:
        writer = ChatWriter(req, self.model_name, self.token_text)
        tools = req.active_tools
        # With tools the raw text may hold a tool call, so the parsed message comes at the end.
        text_deltas = not tools
        yield wire.sse(writer.opening())
        try:
            async for item in self.backend.stream(prompt_ids, params):
                if isinstance(item, Delta):
                    chunk = writer.delta(item, with_text=text_deltas)
                    if chunk is not None:
                        yield wire.sse(chunk)
                    continue
                message = cut_at_stop(
                    self.renderer.parse(item.completion_ids, tools=tools, prompt_ids=prompt_ids),
                    item,
                )
                yield wire.sse(
                    writer.closing(prompt_ids, item, message, final_message=not text_deltas)
                )
                if req.include_usage:
                    yield wire.sse(writer.usage(len(prompt_ids), item))
        except RequestError as exc:
            yield wire.sse(request_error_body(exc))
        yield wire.DONE


_FIELD_PATH = re.compile(r"at `\$\.([^`]+)`")


def _client_error(status: int) -> Callable[[Request, Exception], Any]:
    async def handle(request: Request, exc: Exception) -> Response:
        if isinstance(exc, RequestError):
            return _json(request_error_body(exc), status=status)
        # msgspec names the offending field as a JSON path at the end of its message.
        field = _FIELD_PATH.search(str(exc))
        return _json(
            wire.error_body(str(exc), param=field.group(1) if field else None), status=status
        )

    return handle


def create_inference_app(
    backend: InferenceBackend,
    renderer: Renderer,
    token_text: Callable[[int], str],
    model_name: str,
    aliases: tuple[str, ...] = (),
) -> ASGIApp:
    """The ASGI app; starting it starts the backend, shutting it down stops the backend."""
    api = InferenceAPI(backend, renderer, token_text, model_name, aliases)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await backend.start()
        try:
            yield
        finally:
            await backend.stop()

    app = Starlette(
        routes=[
            Route("/health", api.health),
            Route("/v1/models", api.models),
            Route("/v1/stats", api.stats),
            Route("/metrics", api.stats),
            Route("/v1/chat/completions", api.chat, methods=["POST"]),
            Route("/v1/generate", api.generate, methods=["POST"]),
            Route("/v1/score", api.score, methods=["POST"]),
            Route("/v1/weights", api.weights, methods=["POST"]),
        ],
        exception_handlers={
            UnknownModelError: _client_error(404),
            RequestError: _client_error(400),
            RendererError: _client_error(400),
            CheckpointError: _client_error(400),
            msgspec.ValidationError: _client_error(400),
            msgspec.DecodeError: _client_error(400),
        },
        lifespan=lifespan,
    )
    return _Traced(_VersionHeader(app, lambda: backend.policy_version), model_name)
