"""`rlbus worker inference`: serve HTTP and follow the `weights` topic in one process.

Every inference worker must load every WeightVersion, so each consumes `weights` in a
consumer group of its own (`inference-<worker id>`) rather than sharing one group, which
would hand each version to a single worker. A new worker replays the topic from the start
and loads only the newest version of each polled batch.
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn
from starlette.types import ASGIApp

from rlbus.bus import Bus, Delivery
from rlbus.config import Settings
from rlbus.consumers.inference.api import InferenceBackend
from rlbus.consumers.inference.weights import WeightFollower, newest
from rlbus.schemas import WeightLoaded


def default_worker_id(port: int) -> str:
    """Stable across restarts of the same worker, so its consumer group resumes where it stopped."""
    return f"{socket.gethostname()}-{port}"


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

    announcing = asyncio.create_task(bus.keep_announcing(lambda: served, stop))
    try:
        await bus.consume(
            f"inference-{follower.worker_id}", ["weights"], on_batch=on_batch, stop=stop
        )
    finally:
        announcing.cancel()


async def run_worker(
    settings: Settings,
    backend: InferenceBackend,
    app: ASGIApp,
    host: str,
    port: int,
    stop: asyncio.Event,
    worker_id: str | None = None,
) -> None:
    """Serve `app` on host:port and follow weights until `stop` is set."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    # The app's lifespan starts the backend: weights must not be loaded into an unstarted engine.
    while not server.started:
        if serving.done():
            await serving  # surfaces why the server could not start (port taken...)
            raise RuntimeError(f"inference server on {host}:{port} stopped before it started")
        await asyncio.sleep(0.05)
    follower = WeightFollower(backend, worker_id or default_worker_id(port))
    try:
        async with Bus(settings) as bus:
            await follow_weights(bus, follower, settings.run_id, stop)
    finally:
        server.should_exit = True
        await serving
