"""Serving while following the `weights` topic, in one process (the inference role's work; its
door: consumers/inference/role.py).

Every inference worker must load every WeightVersion, so each consumes `weights` in a
consumer group of its own (`inference-<worker id>`) rather than sharing one group, which
would hand each version to a single worker. A new worker replays the topic from the start
and loads only the newest version of each polled batch.
"""

from __future__ import annotations

import asyncio
import socket

import msgspec
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from rlbus.bus import Bus, Delivery
from rlbus.bus.topic_reader import read_back
from rlbus.bus.waiting import wait_until
from rlbus.config import Settings
from rlbus.consumers.heartbeat import keep_announcing
from rlbus.consumers.inference.api import InferenceBackend
from rlbus.consumers.inference.weights import WeightFollower, newest
from rlbus.schemas import WeightLoaded, group_of


def default_worker_id(port: int) -> str:
    """Stable across restarts of the same worker, so its consumer group resumes where it stopped."""
    return f"{socket.gethostname()}-{port}"


def weights_group(run_id: str, worker_id: str) -> str:
    """Every replica loads every version: a consumer group of its own."""
    return group_of("inference", run_id, worker_id)


def advertised_url(host: str, port: int) -> str:
    """The /v1 URL announced for a worker bound to host:port: a wildcard address names this
    machine instead (env producers elsewhere cannot reach 0.0.0.0)."""
    reachable = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
    return f"http://{reachable}:{port}/v1"


async def follow_weights(
    bus: Bus, follower: WeightFollower, run_id: str, stop: asyncio.Event
) -> None:
    """Load each newest WeightVersion of `run_id` and publish WeightLoaded (after the load),
    re-published while serving so that a restarted orchestrator learns what is served."""
    served: WeightLoaded | None = None

    async def on_batch(deliveries: list[Delivery]) -> None:
        nonlocal served
        event = newest((d.event for d in deliveries), run_id)
        if event is None:
            return
        loaded = await follower.on_weight_version(event)
        if loaded is not None:
            await bus.publish(loaded)
            served = loaded

    every_s = bus.kafka.announce_every_s
    announcing = asyncio.create_task(keep_announcing(bus, lambda: served, every_s, stop))
    try:
        group = weights_group(run_id, follower.worker_id)
        consume = bus.subscriber("weights", group=group, batch=True, run=run_id)
        await consume(on_batch).run(stop)
    finally:
        announcing.cancel()


class Gate:
    """ASGI middleware that answers 503 (health included) until the worker serves its run's
    current weights: a restarted worker never serves its starting weights under the run's
    name while the run is at a later version."""

    def __init__(self, app: ASGIApp, run_id: str):
        self.app = app
        self.run_id = run_id
        self.open = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.open or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = msgspec.json.encode(
            {"status": "loading", "error": f"catching up with the weights of run {self.run_id!r}"}
        )
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def catch_up(bus: Bus, follower: WeightFollower, run_id: str) -> WeightLoaded | None:
    """Load the newest WeightVersion the run has announced so far, if any (none: a fresh run,
    whose version 0 is the starting weights)."""
    latest = newest(await read_back(bus, "weights", run_id), run_id)
    if latest is None:
        return None
    loaded = await follower.on_weight_version(latest)
    if loaded is not None:
        await bus.publish(loaded)
    return loaded


async def serve_following_weights(
    settings: Settings,
    backend: InferenceBackend,
    app: ASGIApp,
    host: str,
    port: int,
    stop: asyncio.Event,
    worker_id: str | None = None,
    url: str | None = None,
    follow: bool = True,
) -> None:
    """Serve `app` on host:port and follow weights until `stop` is set. Requests are answered
    503 until the run's newest announced weights are loaded. `url`: the /v1 URL announced with
    every WeightLoaded (default: advertised_url(host, port)). `follow` False: serve the weights
    as loaded, with no bus (a distillation teacher: no run's versions are its own)."""
    gate = Gate(app, settings.run_id)
    server = uvicorn.Server(uvicorn.Config(gate, host=host, port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())

    # The app's lifespan starts the backend: weights must not be loaded into an unstarted engine.
    def still_starting() -> None:
        if serving.done():
            serving.result()  # surfaces why the server could not start (port taken...)
            raise RuntimeError(f"inference server on {host}:{port} stopped before it started")

    await wait_until(
        lambda: server.started, 600, f"inference on {host}:{port}", 0.05, still_starting
    )
    try:
        if not follow:
            gate.open = True
            await stop.wait()
            return
        follower = WeightFollower(
            backend, worker_id or default_worker_id(port), url or advertised_url(host, port)
        )
        async with Bus.of(settings) as bus:
            await catch_up(bus, follower, settings.run_id)
            gate.open = True
            await follow_weights(bus, follower, settings.run_id, stop)
    finally:
        server.should_exit = True
        await serving
