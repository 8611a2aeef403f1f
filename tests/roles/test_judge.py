"""The judge: rules that raise or hang mark their rollouts errored with the reason; group rewards
see the whole group. End to end: env producer + judge on the real broker, sink into chdb."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ScriptedModel, ScriptedServer

from rlbus.bus import Bus
from rlbus.bus.store import open_store
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings
from rlbus.consumers.judge.role import JudgeRole
from rlbus.discovery import store_served_elsewhere
from rlbus.environment import (
    Scorer,
    TaskSet,
    group_reward,
    load_environment,
    metric,
    reward,
)
from rlbus.environment.rules import threads
from rlbus.launch.processes import RoleProcess, alive
from rlbus.producers.role import EnvProducerRole
from rlbus.schemas import RolloutCompleted, RolloutScored

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class Fragile(TaskSet):
    @reward
    def fine(self, text: str) -> float:
        return 1.0

    @reward
    def picky(self, text: str) -> float:
        if text == "boom":
            raise ValueError("cannot judge 'boom'")
        return 0.5

    @reward
    async def slow(self, text: str) -> float:
        if text == "slow":
            await asyncio.sleep(30)
        return 0.0


CALLED: list[tuple[str, str]] = []


class Synchronous(TaskSet):
    """Three synchronous rules; the middle one blocks on "hog"."""

    @reward
    def first(self, text: str) -> float:
        CALLED.append(("first", text))
        return 1.0

    @reward
    def hog(self, text: str) -> float:
        CALLED.append(("hog", text))
        if text == "hog":
            time.sleep(2)
        return 0.5

    @metric
    def chars(self, text: str) -> float:
        CALLED.append(("chars", text))
        return float(len(text))


class BadGroup(TaskSet):
    @group_reward
    def wrong_length(self, texts: list[str]) -> list[float]:
        return [1.0]


def rollouts(*texts: str, status: str = "ok") -> list[RolloutCompleted]:
    return [
        RolloutCompleted(
            rollout_id=f"r{i}",
            group_id="g",
            task_id="t",
            env="e",
            sample_index=i,
            group_size=len(texts),
            answer="olleh",
            status=status,
            error="harness crashed" if status != "ok" else "",
            completion=[{"role": "assistant", "content": t}],
        )
        for i, t in enumerate(texts)
    ]


def score(env_ref: str, items: list[RolloutCompleted], **overrides: object) -> list[RolloutScored]:
    return asyncio.run(Scorer(load_environment(env_ref, dict(overrides))).score(items))


def test_a_reward_that_raises_or_times_out_errors_only_its_rollout() -> None:
    scored = score(f"{__name__}:Fragile", rollouts("ok", "boom", "slow"), reward_timeout_s=0.3)
    assert [s.status for s in scored] == ["ok", "error", "error"]
    assert scored[0].reward == 1.5 and scored[0].rewards == {"fine": 1.0, "picky": 0.5, "slow": 0.0}
    assert (
        scored[1].error == "reward 'picky' raised ValueError: cannot judge 'boom'"
        and scored[1].reward == 0.0
    )
    assert scored[2].error == "reward 'slow' timed out after 0.3s"


def test_a_rollouts_synchronous_rules_go_to_their_threads_in_one_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One hand-over to the rules' threads per rollout, not one per rule (each cost the event
    loop a thread wake-up and a self-pipe round trip); each rule keeps its own time limit, and
    the rules after one past it are still run."""
    jobs = []
    submit = threads().submit

    def counted(fn, *args, **kwargs):
        jobs.append(fn)
        return submit(fn, *args, **kwargs)

    monkeypatch.setattr(threads(), "submit", counted)
    CALLED.clear()
    fast = score(f"{__name__}:Synchronous", rollouts("ab", "abc"), reward_timeout_s=5)
    assert len(jobs) == 2  # two rollouts, three rules each
    assert [(s.rewards, s.metrics) for s in fast] == [
        ({"first": 1.0, "hog": 0.5}, {"chars": 2.0}),
        ({"first": 1.0, "hog": 0.5}, {"chars": 3.0}),
    ]
    CALLED.clear()
    (slow,) = score(f"{__name__}:Synchronous", rollouts("hog"), reward_timeout_s=0.3)
    assert slow.error == "reward 'hog' timed out after 0.3s"
    assert ("chars", "hog") in CALLED  # run in a job of its own after the hog was given up


def test_errored_rollouts_stay_errored_and_bad_group_rewards_are_reported() -> None:
    (crashed,) = score(f"{__name__}:Fragile", rollouts("x", status="error"))
    assert (crashed.status, crashed.error, crashed.rewards) == ("error", "harness crashed", {})
    scored = score(f"{__name__}:BadGroup", rollouts("a", "b"))
    assert {s.error for s in scored} == {
        "group_reward 'wrong_length' returned 1 scores for a group of 2 scored rollouts"
    }


def test_conciseness_bonus_goes_to_the_shortest_correct_answer() -> None:
    scored = score(str(EXAMPLES / "reverse_text"), rollouts("olleh  ", "wrong", "olleh", " olleh "))
    assert [s.rewards["concise"] for s in scored] == [0.0, 0.0, 1.0, 0.0]
    assert scored[2].reward == pytest.approx(1.0 + 0.5 + 0.25)


@pytest.fixture
def sink(settings: Settings, tmp_path: Path) -> Iterator[RoleProcess]:
    process = RoleProcess("sink", settings, tmp_path / "logs")
    yield process
    process.stop()


def test_env_producer_and_judge_over_the_bus(settings: Settings, sink: RoleProcess) -> None:
    """Tasks in; rollouts from the env producer; the judge scores complete groups (one partition
    each) with the conciseness group reward; the sink lands everything in ClickHouse."""
    pads = itertools.cycle(["", "  ", "!", " "])

    def answers(messages: list[dict], tools: object) -> dict:
        word = messages[-1]["content"].split()[-1][::-1]
        pad = next(pads)
        return {"content": "wrong" if pad == "!" else word + pad}

    env_tasks, size = 8, 4
    with ScriptedServer(ScriptedModel(chat=answers)) as upstream:
        env = load_environment(
            str(EXAMPLES / "reverse_text"),
            {"group_size": size, "model": {"name": "scripted", "base_url": f"{upstream.url}/v1"}},
        )
        tasks = list(env.tasks(settings.run_id).take(env_tasks))

        async def main() -> None:
            stop = asyncio.Event()
            workers = [
                asyncio.create_task(EnvProducerRole(settings, env).run(stop)),
                asyncio.create_task(JudgeRole(settings, [env]).run(stop)),
            ]
            async with Bus.of(settings) as bus:
                await bus.publish_many(tasks)
            await asyncio.to_thread(
                wait_for,
                lambda: scored_count() >= env_tasks * size,
                90,
                "scores in the store",
                check=alive(sink),
            )
            stop.set()
            await asyncio.gather(*workers)

        def scored_count() -> int:
            if not store_served_elsewhere(settings):
                return 0
            with open_store(settings.store.url, read_only=True) as store:
                return int(
                    store.query(
                        "SELECT count() FROM scored FINAL WHERE run_id = {r:String}",
                        {"r": settings.run_id},
                    ).rows[0][0]
                )

        asyncio.run(main())
    with open_store(settings.store.url, read_only=True) as store:
        params = {"r": settings.run_id}
        texts = {
            r: t
            for r, t in store.query(
                "SELECT rollout_id, JSONExtractString(completion, 1, 'content') FROM rollouts "
                "FINAL "
                "WHERE run_id = {r:String}",
                params,
            ).rows
        }
        groups = store.query(
            "SELECT group_id, groupArray((rollout_id, rewards['exact'], rewards['concise'])) FROM "
            "scored FINAL "
            "WHERE run_id = {r:String} GROUP BY group_id",
            params,
        ).rows
        partitions = store.query(
            "SELECT group_id, uniqExact(kafka_partition) FROM rollouts FINAL "
            "WHERE run_id = {r:String} GROUP BY group_id",
            params,
        ).rows
        counts = store.query(
            "SELECT (SELECT count() FROM rollouts WHERE run_id = {r:String}), "
            "(SELECT count() FROM trace_nodes WHERE run_id = {r:String}), "
            "(SELECT count() FROM tokens WHERE run_id = {r:String})",
            params,
        ).rows[0]
    assert len(groups) == env_tasks and {n for _, n in partitions} == {1}
    for _group, members in groups:
        assert len(members) == size
        correct = [len(texts[r]) for r, exact, _ in members if exact == 1.0]
        for rollout_id, exact, concise in members:
            assert concise == float(exact == 1.0 and len(texts[rollout_id]) == min(correct))
    # Each rollout: a system, a user and an assistant node, one token record.
    assert tuple(counts) == (env_tasks * size, env_tasks * size * 3, env_tasks * size)
