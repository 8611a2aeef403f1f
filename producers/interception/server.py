"""The interception server: one per env producer, on 127.0.0.1. Each rollout gets its own base
URL holding an unguessable token; whatever its harness sends there (OpenAI chat or Responses,
Anthropic messages) becomes a ModelCall that is sent on with the run's sampling settings and
recorded in the rollout's trace. In-process harnesses skip HTTP and call the session directly:
the same recording either way.

Streaming responses are sent once the backend's answer is complete (the backend is asked for
whole completions), as the protocol's full event sequence.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import uvicorn
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rlbus.bus import telemetry
from rlbus.config.env import SamplingConfig
from rlbus.producers.interception.anthropic_messages import AnthropicMessages
from rlbus.producers.interception.calls import Backend, CallResult, ModelCall, Tools, UpstreamError
from rlbus.producers.interception.openai_chat import OpenAIChat
from rlbus.producers.interception.openai_responses import OpenAIResponses
from rlbus.producers.interception.trace import Trace
from rlbus.producers.interception.wire import BadRequest, WireFormat

WIRES: dict[str, WireFormat] = {
    "chat/completions": OpenAIChat(),
    "responses": OpenAIResponses(),
    "messages": AnthropicMessages(),
}


class RolloutSession:
    """One rollout's view of the server: its URLs, its trace, and `chat` for in-process harnesses."""

    def __init__(self, server: InterceptionServer, rollout_id: str, token: str):
        self.server = server
        self.rollout_id = rollout_id
        self.token = token
        self.trace = Trace(rollout_id)
        root = f"{server.url}/r/{token}"
        self.base_url = f"{root}/v1"
        """For OpenAI clients (OPENAI_BASE_URL)."""
        self.anthropic_base_url = root
        """For Anthropic clients, which append /v1/messages themselves (ANTHROPIC_BASE_URL)."""

    async def complete(self, call: ModelCall, provider: str = "rlbus") -> CallResult:
        server = self.server
        call = call.with_sampling(server.sampling)
        plan = self.trace.plan(call.messages)
        requested = {
            "gen_ai.request.temperature": call.temperature,
            "gen_ai.request.top_p": call.top_p,
            "gen_ai.request.max_tokens": call.max_tokens,
            "gen_ai.request.seed": call.seed,
        }
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": server.backend.model,
            "rlbus.rollout_id": self.rollout_id,
            "rlbus.branch_id": plan.branch,
            "rlbus.mode": server.backend.mode,
            **{k: v for k, v in requested.items() if v is not None},
        }
        with telemetry.span(
            f"chat {server.backend.model}", SpanKind.CLIENT, attributes=attributes
        ) as span:
            try:
                result = await server.backend.complete(call, plan.prior)
            except BaseException:
                self.trace.abandon(plan)
                raise
            recorded = self.trace.commit(plan, call.messages, result)
            if span is not None:
                span.set_attributes(
                    {
                        "gen_ai.response.model": result.model,
                        "gen_ai.response.finish_reasons": [result.finish_reason],
                        "gen_ai.usage.input_tokens": result.prompt_tokens,
                        "gen_ai.usage.output_tokens": result.completion_tokens,
                        "rlbus.call_index": recorded.index,
                        "rlbus.policy_version": result.policy_version,
                    }
                )
        return result

    async def chat(
        self, messages: list[dict[str, Any]], tools: Tools = None, **sampling: Any
    ) -> CallResult:
        return await self.complete(ModelCall(messages=messages, tools=tools, **sampling))


def _json(body: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, media_type="application/json")


class InterceptionServer:
    """`async with InterceptionServer(backend, sampling) as server:` then `server.session(rollout_id)`."""

    def __init__(
        self,
        backend: Backend,
        sampling: SamplingConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.backend = backend
        self.sampling = sampling or SamplingConfig()
        self.sessions: dict[str, RolloutSession] = {}
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.url = f"http://{host}:{self._socket.getsockname()[1]}"
        app = Starlette(
            routes=[
                Route("/r/{token}/v1/models", self._models, methods=["GET"]),
                Route("/r/{token}/v1/{route:path}", self._call, methods=["POST"]),
            ]
        )
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            backlog=4096,
        )
        config.load()
        self._server = uvicorn.Server(config)
        # Serve inside the caller's event loop without uvicorn's own signal handling, which
        # would take over the producer's SIGINT/SIGTERM.
        self._server.lifespan = config.lifespan_class(config)

    async def __aenter__(self) -> InterceptionServer:
        await self._server.startup(sockets=[self._socket])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.shutdown(sockets=[self._socket])
        await self.backend.close()

    @contextlib.contextmanager
    def session(self, rollout_id: str) -> Iterator[RolloutSession]:
        """A rollout's session; its URLs stop answering when the block ends."""
        session = RolloutSession(self, rollout_id, secrets.token_urlsafe(24))
        self.sessions[session.token] = session
        try:
            yield session
        finally:
            del self.sessions[session.token]

    async def _models(self, request: Request) -> Response:
        if request.path_params["token"] not in self.sessions:
            return _json(
                {
                    "error": {
                        "message": "unknown or finished rollout",
                        "type": "authentication_error",
                    }
                },
                401,
            )
        return _json(
            {
                "object": "list",
                "data": [
                    {"id": self.backend.model, "object": "model", "created": 0, "owned_by": "rlbus"}
                ],
            }
        )

    async def _call(self, request: Request) -> Response:
        wire = WIRES.get(request.path_params["route"])
        if wire is None:
            return _json(
                {
                    "error": {
                        "message": f"no endpoint /v1/{request.path_params['route']}; served: "
                        f"{', '.join('/v1/' + r for r in WIRES)}",
                        "type": "not_found",
                    }
                },
                404,
            )
        session = self.sessions.get(request.path_params["token"])
        if session is None:
            return _json(
                wire.error(401, "unknown or finished rollout: this URL is no longer served"), 401
            )
        try:
            parsed = wire.parse(msgspec.json.decode(await request.body()))
        except (BadRequest, msgspec.DecodeError, KeyError, TypeError, AttributeError) as exc:
            return _json(wire.error(400, f"bad request: {exc}"), 400)
        try:
            result = await session.complete(parsed.call, wire.name)
        except UpstreamError as exc:
            return _json(wire.error(exc.status, str(exc)), exc.status)
        except Exception as exc:
            return _json(wire.error(500, f"{type(exc).__name__}: {exc}"), 500)
        response_id = uuid.uuid4().hex
        if parsed.stream:
            return StreamingResponse(
                wire.events(parsed, result, response_id), media_type="text/event-stream"
            )
        return _json(wire.respond(parsed, result, response_id))
