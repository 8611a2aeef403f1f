"""Several inference replicas behind one run: what the roster counts as served, how a rollout's
route picks a replica, and (two real inference servers on 127.0.0.1, the built-in engine on a
tiny model) that a multi-turn rollout stays on one replica and that a call whose replica is gone
is made again on the other, counted, with both attempts in the rollout's trace; and that the
roster of announcements keeps following the replicas across an outage of the real broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import msgspec
import pytest
import uvicorn
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.isolated import isolated_settings

from rlbus.bus import Bus, EmbeddedBroker, free_port, telemetry
from rlbus.bus.announcements import follow_announcements
from rlbus.bus.waiting import wait_until
from rlbus.clients.replicas import Replicas, Roster, Route
from rlbus.config.env import ModelConfig
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.service import build_app, build_backend
from rlbus.environment import load_environment
from rlbus.producers.interception import InterceptionServer, TokenBackend
from rlbus.producers.rollouts import RolloutRunner
from rlbus.schemas import WeightLoaded

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
A, B, C = "http://a/v1", "http://b/v1", "http://c/v1"


def loaded(worker: str, version: int, url: str = "") -> WeightLoaded:
    return WeightLoaded(run_id="r", worker_id=worker, version=version, url=url)


def test_a_version_counts_as_served_once_enough_live_replicas_serve_it() -> None:
    roster = Roster(announce_every_s=1.0)  # silent for 3 s: gone
    assert roster.served() is None
    roster.heard(loaded("w1", 3, A), at=100.0)
    roster.heard(loaded("w2", 2, B), at=100.0)
    assert roster.served(now=100.5) == 2  # every live replica (the default)
    assert roster.served(quorum=1, now=100.5) == 3
    assert roster.served(quorum=5, now=100.5) == 2  # more than are live: every live one
    # w2 keeps announcing, w1 falls silent: only w2 counts.
    roster.heard(loaded("w2", 2, B), at=103.0)
    assert roster.served(now=104.0) == 2
    roster.heard(loaded("w2", 4, B), at=104.0)
    roster.heard(loaded("w2", 2, B), at=103.5)  # an older one, read late: changes nothing
    assert roster.served(now=104.5) == 4
    assert [r.worker_id for r in roster.live(now=104.5)] == ["w2"]
    assert (roster.version_of(B, now=104.5), roster.version_of(A, now=104.5)) == (4, None)


@pytest.mark.slow
async def test_the_roster_hears_replicas_again_after_the_broker_was_unreachable(
    tmp_path: Path,
) -> None:
    """A follower that cannot reach the broker (here: gone when it starts) tries again, and hears
    the re-announcements once it is back. Before, its task died with the connection error, and
    even on a healthy broker it heard nothing (it took a record's list of events for an event):
    an orchestrator that took over then waited for ever for a version its replicas served
    (issue 20, the standby that led and published nothing)."""
    port = free_port()
    stop = asyncio.Event()
    roster = Roster(announce_every_s=1.0)
    with EmbeddedBroker(port=port) as first:
        settings = isolated_settings(first, tmp_path, run_id="r")
        async with Bus.of(settings) as bus:
            first.stop()
            following = asyncio.create_task(follow_announcements(bus, "r", roster.heard, stop))
            await asyncio.sleep(2)  # its first attempts fail: nothing listens on the port
            assert not following.done(), following.exception()
            with EmbeddedBroker(port=port):  # back on its address, empty (Tansu keeps no data)
                async with Bus.of(settings) as replica:
                    await replica.ensure_topics(["weights"])
                    # A replica re-announces while it serves; what the roster says is read
                    # here, while it does: after the closing below (seconds, on a loaded
                    # machine) the replica is rightly no longer live (CI read None, once). How
                    # soon it is heard again is no part of this test: that it is.
                    served, deadline = None, time.monotonic() + 180
                    while served != 3 and time.monotonic() < deadline:
                        await replica.publish(loaded("w", 3))
                        await asyncio.sleep(1)
                        served = roster.served()
                    assert not following.done(), following.exception()
                stop.set()
                await following
    assert served == 3


def test_a_route_keeps_its_replica_and_new_routes_go_to_the_least_busy() -> None:
    replicas = Replicas([A, B], Roster())
    first, second = Route(), Route()
    assert replicas.pick(first) == A
    first.replica = A
    replicas.outstanding[A] = 3
    assert replicas.pick(second) == B
    assert replicas.pick(first) == A  # sticky while A serves, however busy
    replicas.down_until[A] = float("inf")  # A failed a call moments ago
    assert replicas.pick(first) == B
    assert replicas.pick(Route(), tried=[B]) is None


def test_replicas_behind_the_task_version_are_passed_over_while_another_serves_it() -> None:
    roster = Roster()
    replicas = Replicas([A, B], roster)
    roster.heard(loaded("wa", 5, A), at=time.time())
    roster.heard(loaded("wb", 4, B), at=time.time())
    roster.heard(loaded("wc", 4, C), at=time.time())  # announced, not configured: joins
    pinned = Route(min_version=5, replica=B)
    assert replicas.pick(pinned) == A  # its replica fell behind the task's version
    replicas.outstanding[A] = 9
    assert replicas.pick(Route(min_version=4)) == B  # B and C serve 4; B is first of equals
    assert replicas.pick(Route(min_version=6)) == A  # none serves 6: the freshest answers
    assert replicas.behind == 1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny")
    init_model(path, seed=0)
    return path


@asynccontextmanager
async def inference_server(model: Path) -> AsyncIterator[tuple[str, Callable[[], Awaitable]]]:
    """A real inference server (built-in engine) on a free loopback port: its /v1 URL, and what
    stops it."""
    port = free_port()
    app = build_app(build_backend(model), model)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    await wait_until(lambda: server.started or serving.done(), 60, "the inference server")

    async def stop() -> None:
        server.should_exit = True
        await serving

    try:
        yield f"http://127.0.0.1:{port}/v1", stop
    finally:
        await stop()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer(provider.get_tracer("rlbus-test"))
    try:
        yield exporter
    finally:
        telemetry.use_tracer(None)


async def test_rollouts_stay_on_a_replica_and_move_when_it_dies(
    tiny: Path, spans: InMemorySpanExporter
) -> None:
    env = load_environment(
        str(EXAMPLES / "guess_number"),
        {"harness": {"max_turns": 3}, "sampling": {"max_tokens": 4}},
    )
    task = next(iter(env.tasks("r")))
    async with AsyncExitStack() as stack:
        (a, stop_a), (b, _) = [
            await stack.enter_async_context(inference_server(tiny)) for _ in range(2)
        ]
        config = ModelConfig(
            name="tiny", base_url=a, replica_urls=[b], mode="train", tokenizer=str(tiny)
        )
        backend = TokenBackend(config)
        async with InterceptionServer(backend, env.config.sampling) as server:
            runner = RolloutRunner(env, server)
            group = await asyncio.gather(*(runner.run(task, "g1", i, 4) for i in range(4)))
            by_rollout = {out.rollout.rollout_id: {t.replica for t in out.tokens} for out in group}
            assert all(out.rollout.status == "ok" for out in group), group[0].rollout.error
            assert all(len(out.tokens) > 1 for out in group)  # several turns each...
            assert all(len(replicas) == 1 for replicas in by_rollout.values())  # ...on one
            assert set().union(*by_rollout.values()) == {a, b}  # spread over both
            assert backend.replicas.retried == 0

            # A task asking for version 1, which the roster says only b serves, goes to b.
            backend.replicas.roster.heard(loaded("wa", 0, a), time.time())
            backend.replicas.roster.heard(loaded("wb", 1, b), time.time())
            newer = msgspec.structs.replace(task, min_policy_version=1)
            pinned = await asyncio.gather(*(runner.run(newer, "g2", i, 4) for i in range(4)))
            assert {t.replica for out in pinned for t in out.tokens} == {b}
            backend.replicas.roster.replicas.clear()

            await stop_a()  # replica a goes away
            moved = await asyncio.gather(*(runner.run(task, "g3", i, 4) for i in range(4)))
    assert all(out.rollout.status == "ok" for out in moved), moved[0].rollout.error
    assert {t.replica for out in moved for t in out.tokens} == {b}
    retried = backend.replicas.retried
    assert retried >= 1
    # Each retried call's span holds the failed attempt, naming the replica it failed on.
    failed = [
        e
        for s in spans.get_finished_spans()
        if s.name.startswith("chat ")
        for e in s.events
        if e.name.startswith("inference replica failed")
    ]
    assert len(failed) == retried
    assert all(e.attributes and e.attributes["rlbus.inference.replica"] == a for e in failed)
