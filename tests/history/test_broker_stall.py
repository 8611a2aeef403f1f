"""A broker that stalls while a role publishes what it computed: the publish times out and is
made again, and what lands is what was computed, once (bus/unsent.py).

CI at 7bd5e7f and 367be5d: under load a publish timed out (kafka.request_timeout_ms), the
subscriber ran the handler again, and the env producer ran the whole group again; its second
content (other timings, other samples) was stored beside the first under the same rollout ids,
and readers counted those rollouts twice. A judge asked again (an LLM judge's grade) did the
same to scores."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import ScriptedModel, ScriptedServer
from support.isolated import running_sink

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.store import Store, open_store
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings, load_settings
from rlbus.config.env import cli_overrides
from rlbus.consumers.judge.role import JudgeRole
from rlbus.environment import TaskSet, load_environment, reward
from rlbus.producers.role import EnvProducerRole
from rlbus.schemas import RolloutCompleted, TaskPublished

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"
GROUP = 2
TIMEOUT_MS = 1500
STALL_S = 6.0
"""Longer than a publish waits (TIMEOUT_MS), so the publish under way times out."""
STORED_ROLLOUTS = "SELECT uniqExact(rollout_id) FROM rollouts WHERE run_id = {run:String}"
STORED_ROLLOUTS = "SELECT uniqExact(rollout_id) FROM rollouts WHERE run_id = {run:String}"


@dataclass
class Stalling:
    """A broker of the test's own, a sink storing what lands on it, and a way to stop the
    broker process (SIGSTOP by PID) for STALL_S."""

    broker: EmbeddedBroker
    settings: Settings
    store: Store
    stalled: threading.Event

    def stall(self) -> None:
        self.stalled.set()
        pid = self.broker.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        threading.Timer(STALL_S, os.kill, (pid, signal.SIGCONT)).start()

    def count(self, query: str) -> Any:
        return self.store.query(query, {"run": self.settings.run_id}).rows[0]

    async def wait(self, what: str, done: Callable[[], bool]) -> None:
        await asyncio.to_thread(wait_for, done, 120, what)


@contextlib.asynccontextmanager
async def stalling(tmp_path: Path) -> AsyncIterator[Stalling]:
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
        with (
            running_sink(settings, tmp_path / "logs"),
            open_store(settings.store.url, read_only=True) as store,
        ):
            yield Stalling(broker, settings, store, threading.Event())


async def test_a_publish_that_timed_out_is_made_again_without_running_the_group_again(
    tmp_path: Path,
) -> None:
    calls = 0

    def stall_at_the_second_group(world: Stalling) -> Callable[[], float]:
        """A scripted model's delay: the first call of the second task's group stops the
        broker (the first group's publish made the topics, so what stalls is a publish)."""

        def delay() -> float:
            nonlocal calls
            calls += 1
            if calls == GROUP + 1:
                world.stall()
            return 0.0

        return delay

    async with stalling(tmp_path) as world:
        with ScriptedServer(ScriptedModel(delay_s=stall_at_the_second_group(world))) as upstream:
            env = load_environment(
                str(EXAMPLE), cli_overrides("s", f"{upstream.url}/v1", GROUP, None)
            )
            stop = asyncio.Event()
            role = EnvProducerRole(world.settings, env)
            producer = asyncio.create_task(role.run(stop))
            async with Bus.of(world.settings) as bus:
                for n, word in enumerate(("abc", "xyz"), 1):
                    await bus.publish_many(
                        [TaskPublished(task_id=word, env=env.id, prompt=f"reverse: {word}")]
                    )
                    await world.wait(
                        f"group {n} published and stored",
                        lambda n=n: (
                            role.producer is not None
                            and role.producer.rollouts >= n * GROUP
                            and world.count(STORED_ROLLOUTS)[0] >= n * GROUP
                        ),
                    )
            stop.set()
            summary = await producer
        ids, contents = world.count(
            "SELECT uniqExact(rollout_id), uniqExact(rollout_id, digest) FROM rollouts "
            "WHERE run_id = {run:String}"
        )
        (conflicts,) = world.count("SELECT count() FROM conflicts WHERE run_id = {run:String}")
    assert world.stalled.is_set()
    # Each group ran once: one model call per rollout, one content per rollout id.
    assert calls == len(upstream.model.calls) == 2 * GROUP
    assert (ids, contents, conflicts) == (2 * GROUP, 2 * GROUP, 0)
    assert summary.figures["rollouts"] == 2 * GROUP


GRADED: list[str] = []
"""What Drifting graded, in order."""
ON_GRADE: dict[int, Callable[[], None]] = {}
"""What to do at the Nth grade (1-based)."""


class Drifting(TaskSet):
    """A reward that differs each time it is asked, as an LLM judge's grade may."""

    name = "drifting"

    def rows(self) -> list[dict[str, Any]]:
        return [{"prompt": "reverse: abc", "answer": "cba"}]

    @reward(weight=1.0)
    async def grade(self, prompt: Any, text: str, answer: str, info: dict) -> float:
        GRADED.append(text)
        if hook := ON_GRADE.get(len(GRADED)):
            hook()
        return len(GRADED) / 100


def rollout(i: int) -> RolloutCompleted:
    return RolloutCompleted(
        rollout_id=f"r{i}",
        group_id=f"g{i}",
        task_id=f"t{i}",
        env="drifting",
        group_size=1,
        answer="cba",
        completion=[{"role": "assistant", "content": f"attempt {i}"}],
    )


async def test_scores_whose_publish_timed_out_are_published_again_not_graded_again(
    tmp_path: Path,
) -> None:
    GRADED.clear()
    env = load_environment(f"{__name__}:Drifting")
    async with stalling(tmp_path) as world:
        ON_GRADE[2] = world.stall  # the second rollout's: the first one's publish made the topics
        stop = asyncio.Event()
        role = JudgeRole(world.settings, [env])
        judge = asyncio.create_task(role.run(stop))
        async with Bus.of(world.settings) as bus:
            for i in (1, 2):
                await bus.publish_many([rollout(i)])
                await world.wait(
                    f"rollout {i} scored and stored",
                    lambda i=i: (
                        role.judge is not None
                        and role.judge.scored >= i
                        and world.count("SELECT count() FROM scored WHERE run_id = {run:String}")[0]
                        >= i
                    ),
                )
        stop.set()
        await judge
        scores, contents, rewards = world.count(
            "SELECT uniqExact(event_id), uniqExact(event_id, digest), groupArray(reward) "
            "FROM (SELECT * FROM scored FINAL WHERE run_id = {run:String} ORDER BY rollout_id)"
        )
    ON_GRADE.clear()
    assert world.stalled.is_set()
    assert GRADED == ["attempt 1", "attempt 2"]  # each rollout graded once
    assert (scores, contents, rewards) == (2, 2, [0.01, 0.02])
