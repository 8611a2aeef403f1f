"""The interception server: one per env producer, on 127.0.0.1. Each rollout gets its own base
URL holding an unguessable token; whatever its harness sends there (OpenAI chat or Responses,
Anthropic messages) becomes a ModelCall that is sent on with the run's sampling settings and
recorded in the rollout's trace. In-process harnesses skip HTTP and call the session directly:
the same recording either way.

A runtime that gives a program a network of its own (the sandbox) has the server listen inside it
for that rollout alone (`RolloutSession.serving`); from then on the rollout's token is accepted
only there, and that listener accepts no other token. Request bodies are read up to
`max_request_mb`, never buffered whole first: a larger request gets 413.

A streaming request is answered as the backend samples: the message's text goes out in pieces
as they come (each protocol's own events), then the rest of the message (tool calls, usage,
the finish) once the call is whole and recorded in the trace with its exact ids, log-probs and
versions. The first piece is awaited before the response starts, so a call refused upstream
still gets its status code; a failure later ends the stream with the protocol's error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, cast

import msgspec
import uvicorn
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rlbus.bus import telemetry
from rlbus.bus.server_thread import listening_socket
from rlbus.clients.replicas import Roster
from rlbus.clients.replicas import Route as InferenceRoute
from rlbus.config.env import EnvConfig, HarnessConfig, SamplingConfig
from rlbus.producers.interception.anthropic_messages import AnthropicMessages
from rlbus.producers.interception.backends import make_backend
from rlbus.producers.interception.calls import Backend, CallResult, ModelCall, Tools, UpstreamError
from rlbus.producers.interception.openai_chat import OpenAIChat
from rlbus.producers.interception.openai_responses import OpenAIResponses
from rlbus.producers.interception.trace import Trace
from rlbus.producers.interception.wire import BadRequest, WireFormat
from rlbus.producers.interception.wire import Request as WireRequest

if TYPE_CHECKING:
    from uvicorn.protocols.http.h11_impl import H11Protocol

WIRES: dict[str, WireFormat] = {
    "chat/completions": OpenAIChat(),
    "responses": OpenAIResponses(),
    "messages": AnthropicMessages(),
}
BOUND = "rlbus.rollout"
"""Connection state on a rollout's own listener: the one token accepted there."""
DEFAULT_MAX_REQUEST_MB: int = HarnessConfig.model_fields["max_request_mb"].default


class RolloutSession:
    """One rollout's view of the server: its URLs, its trace, and `chat` for in-process
    harnesses."""

    def __init__(
        self,
        server: InterceptionServer,
        rollout_id: str,
        token: str,
        route: InferenceRoute | None = None,
    ):
        self.server = server
        self.rollout_id = rollout_id
        self.token = token
        self.route = route or InferenceRoute()
        """Its way to inference: the version its task asks for, the replica answering it."""
        self.trace = Trace(rollout_id)
        self.context = telemetry.current()
        """The rollout's trace context: its model calls arrive on the server's own tasks."""
        self.private = False
        """Served on a listener of its own (`serving`): its token is refused anywhere else."""
        root = f"{server.url}/r/{token}"
        self.base_url = f"{root}/v1"
        """For OpenAI clients (OPENAI_BASE_URL)."""
        self.anthropic_base_url = root
        """For Anthropic clients, which append /v1/messages themselves (ANTHROPIC_BASE_URL)."""

    @property
    def port(self) -> int:
        """The loopback port its URLs name."""
        return self.server.port

    @contextlib.asynccontextmanager
    async def serving(self, listener: socket.socket) -> AsyncIterator[None]:
        """Serve this rollout on `listener` too: a listening socket made for its program alone
        (inside the program's network namespace, or a unix socket mounted into its container).
        From now on its token works there only."""
        self.private = True
        async with self.server.listening(listener, self.token):
            yield

    async def complete(self, call: ModelCall, provider: str = "rlbus") -> CallResult:
        """The call answered whole and recorded."""
        async with aclosing(self.stream(call, provider, pieces=False)) as items:
            async for item in items:
                if isinstance(item, CallResult):
                    return item
        raise AssertionError("a call's stream ends with its result")

    async def stream(
        self, call: ModelCall, provider: str = "rlbus", *, pieces: bool = True
    ) -> AsyncGenerator[str | CallResult]:
        """The call's text in pieces as the backend samples it (with `pieces`), then its result,
        recorded in the trace before it is handed out. A call given up half way (the client
        went away) leaves the trace as it was."""
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
            f"chat {server.backend.model}", SpanKind.CLIENT, self.context, attributes
        ) as span:
            try:
                if pieces:
                    result = None
                    items = server.backend.stream(call, plan.prior, self.route)
                    async with aclosing(items):
                        async for item in items:
                            if isinstance(item, CallResult):
                                result = item
                            else:
                                yield item
                    assert result is not None, "a backend's stream ends with its result"
                else:
                    result = await server.backend.complete(call, plan.prior, self.route)
            except BaseException:
                self.trace.abandon(plan)
                raise
            finally:
                _record_failures(span, self.route.taken_failures())
            recorded = self.trace.commit(plan, call.messages, result, call.tools)
            if span is not None:
                span.set_attributes(
                    {
                        "gen_ai.response.model": result.model,
                        "gen_ai.response.finish_reasons": [result.finish_reason],
                        "gen_ai.usage.input_tokens": result.prompt_tokens,
                        "gen_ai.usage.output_tokens": result.completion_tokens,
                        "rlbus.call_index": recorded.index,
                        "rlbus.policy_version": result.policy_version,
                        "rlbus.inference.replica": result.replica,
                        # Token level (exact ids are recorded when the backend returns them):
                        # how many, and the completion's log-likelihood under its policy.
                        "rlbus.tokens.prompt_ids": len(result.prompt_ids),
                        "rlbus.tokens.completion_ids": len(result.completion_ids),
                        "rlbus.tokens.logprob_sum": float(sum(result.logprobs)),
                    }
                )
        yield result

    async def chat(
        self, messages: list[dict[str, Any]], tools: Tools = None, **sampling: Any
    ) -> CallResult:
        return await self.complete(ModelCall(messages=messages, tools=tools, **sampling))


def _record_failures(span: Any, failures: list[tuple[str, str]]) -> None:
    """Each attempt of the call that failed on one inference replica before another answered,
    as an event of the call's span: the rollout's trace shows every attempt."""
    if span is None:
        return
    for replica, error in failures:
        span.add_event(
            "inference replica failed; call made again on another",
            {"rlbus.inference.replica": replica, "error.message": error[:500]},
        )
    if failures:
        span.set_attribute("rlbus.inference.retries", len(failures))


def _json(body: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, media_type="application/json")


class InterceptionServer:
    """`async with InterceptionServer(backend, sampling) as server:`, then
    `server.session(rollout_id)`."""

    def __init__(
        self,
        backend: Backend,
        sampling: SamplingConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_request_mb: int = DEFAULT_MAX_REQUEST_MB,
    ):
        self.backend = backend
        self.sampling = sampling or SamplingConfig()
        self.max_request_mb = max_request_mb
        self.sessions: dict[str, RolloutSession] = {}
        self._socket = listening_socket(host, port)
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
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

    @classmethod
    def of(
        cls, config: EnvConfig, renderer: Any | None = None, roster: Roster | None = None
    ) -> InterceptionServer:
        """The server for an environment: its model backend, sampling and request limit.
        `renderer` (train mode) overrides the one built from model.tokenizer; `roster`: the
        run's inference replicas as they announce themselves (train mode)."""
        backend = make_backend(config.model, renderer, roster)
        return cls(backend, config.sampling, max_request_mb=config.harness.max_request_mb)

    async def __aenter__(self) -> InterceptionServer:
        await self._server.startup(sockets=[self._socket])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.shutdown(sockets=[self._socket])
        await self.backend.close()

    @contextlib.contextmanager
    def session(self, rollout_id: str, min_version: int = 0) -> Iterator[RolloutSession]:
        """A rollout's session; its URLs stop answering when the block ends. `min_version`: the
        weights version its task asks for (train mode's replicas behind it are passed over)."""
        route = InferenceRoute(min_version=min_version)
        session = RolloutSession(self, rollout_id, secrets.token_urlsafe(24), route)
        self.sessions[session.token] = session
        try:
            yield session
        finally:
            del self.sessions[session.token]

    @contextlib.asynccontextmanager
    async def listening(self, listener: socket.socket, token: str) -> AsyncIterator[None]:
        """Serve `listener` (already listening) for the rollout holding `token` alone."""
        config, state = self._server.config, self._server.server_state
        # uvicorn types the class as a bare asyncio.Protocol; its HTTP protocols (h11, httptools)
        # share H11Protocol's constructor and shutdown().
        http_protocol = cast("type[H11Protocol]", config.http_protocol_class)
        connections: list[H11Protocol] = []

        def connection() -> asyncio.Protocol:
            protocol = http_protocol(config=config, server_state=state, app_state={BOUND: token})
            connections.append(protocol)
            return protocol

        server = await asyncio.get_running_loop().create_server(connection, sock=listener)
        try:
            yield
        finally:
            server.close()
            for protocol in connections:
                if protocol in state.connections:  # still open
                    protocol.shutdown()

    def _refusal(self, request: Request, wire: WireFormat | None) -> Response | None:
        """Why this request's token is not served here, as the response to send; None if it is."""
        token = request.path_params["token"]
        session = self.sessions.get(token)
        if session is None:
            status, message = 401, "unknown or finished rollout: this URL is no longer served"
        elif request.scope.get("state", {}).get(BOUND) != (token if session.private else None):
            status, message = (
                403,
                (
                    "this URL's token belongs to another rollout, or to a rollout whose program "
                    "reaches it through its own listener only: use your own URL"
                ),
            )
        else:
            return None
        if wire is not None:
            return _json(wire.error(status, message), status)
        kind = "authentication_error" if status == 401 else "permission_error"
        return _json({"error": {"message": message, "type": kind}}, status)

    async def _body(self, request: Request) -> bytes | None:
        """The request body, or None when it is over the limit (read up to it, no further)."""
        limit = self.max_request_mb << 20
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def _models(self, request: Request) -> Response:
        refused = self._refusal(request, None)
        if refused is not None:
            return refused
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
        refused = self._refusal(request, wire)
        if refused is not None:
            return refused
        session = self.sessions[request.path_params["token"]]
        body = await self._body(request)
        if body is None:
            message = (
                f"request body over {self.max_request_mb} MiB, the limit set by the env config's "
                "harness.max_request_mb"
            )
            return _json(wire.error(413, message), 413)
        try:
            parsed = wire.parse(msgspec.json.decode(body))
            call = session.trace.continued(parsed.call)
        except (BadRequest, msgspec.DecodeError, KeyError, TypeError, AttributeError) as exc:
            return _json(wire.error(400, f"bad request: {exc}"), 400)
        if parsed.stream:
            return await self._streaming(session, call, parsed, wire)
        try:
            result = await session.complete(call, wire.name)
        except UpstreamError as exc:
            return _json(wire.error(exc.status, str(exc)), exc.status)
        except Exception as exc:
            return _json(wire.error(500, f"{type(exc).__name__}: {exc}"), 500)
        return _json(wire.respond(parsed, result, session.trace.response_id(result)))

    async def _streaming(
        self, session: RolloutSession, call: ModelCall, parsed: WireRequest, wire: WireFormat
    ) -> Response:
        # a stream names its response before the result exists: the name is given to the
        # result's node once recorded, so a follow-up can continue it
        response_id = uuid.uuid4().hex
        items = session.stream(call, wire.name)
        try:
            first = await anext(items)
        except UpstreamError as exc:
            return _json(wire.error(exc.status, str(exc)), exc.status)
        except Exception as exc:
            return _json(wire.error(500, f"{type(exc).__name__}: {exc}"), 500)

        async def pieces() -> AsyncGenerator[str | CallResult]:
            async with aclosing(items):
                yield first
                async for item in items:
                    if isinstance(item, CallResult):
                        session.trace.name_response(response_id, item)
                    yield item

        async def events() -> AsyncIterator[bytes]:
            try:
                async for event in wire.events(parsed, self.backend.model, pieces(), response_id):
                    yield event
            except Exception as exc:  # the response has started: its status cannot change
                status = exc.status if isinstance(exc, UpstreamError) else 500
                yield wire.stream_error(status, f"{type(exc).__name__}: {exc}")

        return StreamingResponse(events(), media_type="text/event-stream")
