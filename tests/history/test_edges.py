"""Nothing is accepted silently (issue 14, findings 9 and 10): an unknown env or an oversized
group is dead-lettered by name, an incomplete group is released as errors after a wait, a run
id already in the store is refused by `rlbus eval`, and `rlbus topics` shows every group."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support import ScriptedServer
from support.factories import completed_rollout
from typer.testing import CliRunner

from rlbus.bus import Bus, Delivery
from rlbus.cli import app
from rlbus.config import Settings, settings_variables
from rlbus.config.env import cli_overrides
from rlbus.consumers.judge.role import JudgeRole
from rlbus.environment import load_environment
from rlbus.producers.role import EnvProducerRole
from rlbus.schemas import DeadLetter, RolloutScored, TaskPublished

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"


async def collect(settings: Settings, topic: str, n: int, timeout_s: float = 60) -> list[Delivery]:
    got: list[Delivery] = []
    done = asyncio.Event()

    async def take(batch: list[Delivery]) -> None:
        got.extend(batch)
        if len(got) >= n:
            done.set()

    async with Bus.of(settings) as bus:
        watch = bus.subscriber(topic, group=f"watch-{topic}", batch=True)(take)
        await asyncio.wait_for(watch.run(done), timeout_s)
    return got


async def test_unknown_envs_and_oversized_groups_are_dead_lettered_by_name(
    settings: Settings,
) -> None:
    with ScriptedServer() as upstream:
        env = load_environment(
            str(EXAMPLE), {**cli_overrides("s", f"{upstream.url}/v1", 2, None), "max_group_size": 8}
        )
        stop = asyncio.Event()
        producer = asyncio.create_task(
            EnvProducerRole(settings, env, run_envs=frozenset({env.id})).run(stop)
        )
        async with Bus.of(settings) as bus:
            await bus.publish_many(
                [
                    TaskPublished(task_id="typo", env="revers_text", prompt="p"),
                    TaskPublished(task_id="huge", env=env.id, prompt="p", group_size=1000),
                    TaskPublished(task_id="fine", env=env.id, prompt="reverse: abc"),
                ]
            )
        letters = [d.event for d in await collect(settings, "dlq", 2)]
        rollouts = await collect(settings, "rollouts", 2)
        stop.set()
        await producer
    errors = sorted(e.error for e in letters if isinstance(e, DeadLetter))
    assert errors == [
        f"task huge: group_size 1000 is over {env.id}'s max_group_size 8",
        f"task typo: unknown env 'revers_text': run {settings.run_id!r} has only {env.id}",
    ]
    assert {d.event.task_id for d in rollouts} == {"fine"}  # type: ignore[attr-defined]
    # `rlbus topics` shows the producer's run-scoped group (on main it knew fixed names only).
    from rich.console import Console

    from rlbus.commands.broker import _describe

    _, groups = await _describe(settings)
    console = Console(record=True, width=300)
    console.print(groups)
    group = f"{settings.kafka.topic_prefix}env.{settings.run_id}.{env.id}"
    assert any(group in line and " tasks " in line for line in console.export_text().splitlines())


async def test_an_incomplete_group_is_scored_as_errors_after_its_wait(settings: Settings) -> None:
    """Two of four rollouts of a group with a group reward, and never the rest: on main the
    judge held them, and its commits, forever."""
    env = load_environment(str(EXAMPLE), {"group_wait_s": 1.0})
    stop = asyncio.Event()
    judge = asyncio.create_task(JudgeRole(settings, [env]).run(stop))
    async with Bus.of(settings) as bus:
        await bus.publish_many([completed_rollout(i, "orphan", 4) for i in range(2)])
        scored = [d.event for d in await collect(settings, "scored", 2, timeout_s=90)]
        stop.set()
        done = await judge
    assert done.figures["incomplete"] == 1
    assert all(isinstance(s, RolloutScored) and s.status == "error" for s in scored)
    assert {s.error for s in scored} == {  # type: ignore[attr-defined]
        "group incomplete: 2 of 4 rollouts arrived within group_wait_s = 1s"
    }


def test_eval_refuses_a_run_id_that_is_already_stored(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On main a second `rlbus eval --run-id R` waited 300 s for scores that merged into the
    first's rows, then failed with a TimeoutError."""
    for key, value in settings_variables(settings).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    with ScriptedServer() as upstream:
        args = ["eval", str(EXAMPLE), "--model", "s", "--base-url", f"{upstream.url}/v1", "-n", "2"]
        first = CliRunner().invoke(app, [*args, "--run-id", "twice"])
        assert first.exit_code == 0, first.output
        second = CliRunner().invoke(app, [*args, "--run-id", "twice"])
        resumed = CliRunner().invoke(app, [*args, "--run-id", "twice", "--resume"])
    assert second.exit_code == 2
    assert "run 'twice' already has 8 scored rollouts" in second.output
    assert resumed.exit_code == 0, resumed.output
