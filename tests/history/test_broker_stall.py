"""A broker that stalls while an env producer publishes a group of rollouts: the publish times
out and is made again, and what lands is the group the producer already ran, once.

CI at 7bd5e7f and 367be5d: under load a publish timed out (kafka.request_timeout_ms), the
subscriber ran the handler again, and the handler ran the whole group again; its second
content (other timings, other samples) was stored beside the first under the same rollout ids,
and readers counted those rollouts twice."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support import ScriptedModel, ScriptedServer
from support.isolated import running_sink

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.bus.waiting import wait_for
from rlbus.config import load_settings
from rlbus.config.env import cli_overrides
from rlbus.environment import load_environment
from rlbus.producers.role import EnvProducerRole
from rlbus.schemas import TaskPublished

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"
GROUP = 2
TIMEOUT_MS = 1500
STALL_S = 15.0
"""Longer than a publish waits (TIMEOUT_MS), so the first publish of the group times out."""


def stall_once(broker: EmbeddedBroker, at_call: int) -> tuple[threading.Event, Any]:
    """A scripted model's delay that, at model call `at_call` (counting from 0), stops the
    broker process (SIGSTOP by PID) and lets it go on STALL_S later."""
    stalled = threading.Event()
    calls = itertools.count()

    def delay() -> float:
        if next(calls) == at_call:
            stalled.set()
            pid = broker.pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            threading.Timer(STALL_S, os.kill, (pid, signal.SIGCONT)).start()
        return 0.0

    return stalled, delay


async def test_a_publish_that_timed_out_is_made_again_without_running_the_group_again(
    tmp_path: Path,
) -> None:
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        settings = load_settings(
            overrides={
                "run_id": f"run-{uuid.uuid4().hex[:8]}",
                "kafka": {
                    "bootstrap_servers": broker.bootstrap_servers,
                    "topic_prefix": "stall.",
                    "partitions": 1,
                    "request_timeout_ms": TIMEOUT_MS,
                },
                "store": {"url": f"chdb://{tmp_path / 'store'}", "flush_interval_s": 0.2},
                "claim_check": {"url": str(tmp_path / "claims")},
            }
        )
        # The second task's group: the first one's publish has made the topics, so what
        # stalls is the publish itself.
        stalled, delay = stall_once(broker, at_call=GROUP)
        run = {"run": settings.run_id}
        with (
            running_sink(settings, tmp_path / "logs"),
            ScriptedServer(ScriptedModel(delay_s=delay)) as upstream,
            open_store(settings.store.url, read_only=True) as store,
        ):

            def landed(n: int) -> Callable[[], bool]:
                """`n` rollouts published (the producer's count) and stored."""
                query = "SELECT uniqExact(rollout_id) FROM rollouts WHERE run_id = {run:String}"
                published = lambda: role.producer is not None and role.producer.rollouts >= n  # noqa: E731
                return lambda: published() and store.query(query, run).rows[0][0] >= n

            env = load_environment(
                str(EXAMPLE), cli_overrides("s", f"{upstream.url}/v1", GROUP, None)
            )
            stop = asyncio.Event()
            role = EnvProducerRole(settings, env)
            producer = asyncio.create_task(role.run(stop))
            async with Bus.of(settings) as bus:
                for n, word in enumerate(("abc", "xyz"), 1):
                    task = TaskPublished(task_id=word, env=env.id, prompt=f"reverse: {word}")
                    await bus.publish_many([task])
                    await asyncio.to_thread(wait_for, landed(n * GROUP), 120, f"group {n}")
            stop.set()
            summary = await producer
            rows, ids, contents = store.query(
                "SELECT count(), uniqExact(rollout_id), uniqExact(rollout_id, digest) "
                "FROM rollouts WHERE run_id = {run:String}",
                run,
            ).rows[0]
            conflicts = store.query(
                "SELECT count() FROM conflicts WHERE run_id = {run:String}", run
            ).rows[0][0]
    assert stalled.is_set()
    # Each group ran once: one model call per rollout, one content per rollout id.
    assert len(upstream.model.calls) == 2 * GROUP
    assert (ids, contents, conflicts) == (2 * GROUP, 2 * GROUP, 0), rows
    assert summary.figures["rollouts"] == 2 * GROUP
