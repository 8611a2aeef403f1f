"""One run never replaces another's work (issue 14, finding 2): env producers serve the run they
were started for, and skip (and count) other runs' tasks; an eval's tasks are its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ScriptedModel, ScriptedServer
from support.isolated import isolated_settings, running_sink

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.bus.waiting import wait_until
from rlbus.config import Settings
from rlbus.config.env import cli_overrides
from rlbus.environment import load_environment
from rlbus.launch.eval import run_eval
from rlbus.producers.role import EnvProducerRole
from rlbus.schemas import TaskPublished

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"


@pytest.fixture
def sinked(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Settings]:
    settings = isolated_settings(broker, tmp_path, flush_interval_s=0.1)
    with running_sink(settings, tmp_path / "logs"):
        yield settings


def query(settings: Settings, sql: str, **params: object) -> list[tuple]:
    with open_store(settings.store.url, read_only=True) as store:
        return store.query(sql, params).rows


async def test_a_later_run_leaves_an_eval_alone(sinked: Settings) -> None:
    """An eval (run A, model a) publishes its tasks to the shared `tasks` topic; a later env
    producer of run B with model b must not run them: on main it re-ran every one and replaced
    A's rollouts (ids came from the task and sample index only)."""
    with (
        ScriptedServer(ScriptedModel(model="a")) as a,
        ScriptedServer(ScriptedModel(model="b")) as b,
    ):
        env_a = load_environment(str(EXAMPLE), cli_overrides("a", f"{a.url}/v1", 2, None))
        eval_a = await asyncio.to_thread(
            run_eval, env_a, sinked, n=5, run_id="run-a", show_progress=False
        )
        assert eval_a.tally.rollouts == 10
        before = query(
            sinked, "SELECT rollout_id, model FROM rollouts FINAL WHERE run_id = 'run-a' ORDER BY 1"
        )

        run_b = sinked.model_copy(update={"run_id": "run-b"})
        env_b = load_environment(str(EXAMPLE), cli_overrides("b", f"{b.url}/v1", 2, None))
        async with Bus.of(run_b) as bus:
            await bus.publish_many(
                [
                    TaskPublished(task_id=f"b{i}", env=env_b.id, prompt="reverse: abc")
                    for i in range(3)
                ]
            )
        stop = asyncio.Event()
        producer = asyncio.create_task(EnvProducerRole(run_b, env_b).run(stop))
        rows_b = "SELECT count() FROM rollouts FINAL WHERE run_id = 'run-b'"
        await wait_until(lambda: query(sinked, rows_b)[0][0] >= 6, 120, "run B's rollouts")
        await asyncio.sleep(3)  # long enough for anything else it would do
        stop.set()
        done = await producer
    after = query(
        sinked, "SELECT rollout_id, model FROM rollouts FINAL WHERE run_id = 'run-a' ORDER BY 1"
    )
    assert after == before and {m for _, m in after} == {"a"} and len(after) == 10
    assert done.figures["rollouts"] == 6 and done.figures["skipped"] == {"run-a": 5}
    models = query(sinked, "SELECT DISTINCT model FROM rollouts FINAL WHERE run_id = 'run-b'")
    assert models == [("b",)]


def test_rollout_ids_name_the_run_that_produced_them() -> None:
    """Outputs derived from an input take the producing run into their id: the same task event
    run by two runs yields two sets of rollouts."""
    from rlbus.producers.rollouts import rollout_id_of

    assert rollout_id_of("group-1", "run-a", 0) != rollout_id_of("group-1", "run-b", 0)
    assert rollout_id_of("group-1", "run-a", 0) == rollout_id_of("group-1", "run-a", 0)
