"""Identity across restarts and runs (issue 14, findings 1 and 2): ids never depend on where a
message sat, and one run's work never replaces another's."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import broker_settings, publish_json, sink_until

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.store import open_store


def task_json(i: int) -> bytes:
    return b'{"task_id": "t%d", "env": "reverse_text", "prompt": "olleh %d"}' % (i, i)


@pytest.mark.slow
async def test_tasks_sent_to_a_restarted_broker_are_all_stored(tmp_path: Path) -> None:
    """Two batches of different JSON tasks without ids, each to a fresh embedded broker (offsets
    from 0 again), into one store: all 80 are stored, under 80 ids. On main the second batch took
    the first's position-derived ids and its blocks were dropped as replays."""
    store_dir = tmp_path / "store"
    with open_store(f"chdb://{store_dir}") as store:
        for batch in range(2):
            with EmbeddedBroker() as broker:
                settings = broker_settings(broker, store_dir)
                await publish_json(settings, [task_json(batch * 40 + i) for i in range(40)])
                landed = await sink_until(
                    settings, store, "SELECT count() FROM tasks FINAL", 40 * (batch + 1)
                )
        ids = store.query("SELECT uniqExact(event_id), uniqExact(task_id) FROM tasks").rows[0]
    assert landed == 80 and ids == (80, 80)


@pytest.mark.slow
async def test_the_same_task_sent_twice_is_one_event(tmp_path: Path) -> None:
    """A task without an id takes its natural key (run, env, task id): sent again, after other
    tasks this time, it collapses into the one stored task."""
    store_dir = tmp_path / "store"
    with open_store(f"chdb://{store_dir}") as store, EmbeddedBroker() as broker:
        settings = broker_settings(broker, store_dir)
        await publish_json(settings, [task_json(1)])
        await publish_json(settings, [task_json(i) for i in range(2, 6)] + [task_json(1)])
        await sink_until(settings, store, "SELECT uniqExact(task_id) FROM tasks", 5)
        rows = store.query("SELECT count(), uniqExact(event_id) FROM tasks FINAL").rows[0]
    assert rows == (5, 5)


@pytest.mark.slow
async def test_dead_letters_across_a_broker_restart_keep_apart(tmp_path: Path) -> None:
    """Two different malformed messages at the same offset of two broker lifetimes are two dead
    letters, not one."""
    store_dir = tmp_path / "store"
    with open_store(f"chdb://{store_dir}") as store:
        for i in range(2):
            with EmbeddedBroker() as broker:
                settings = broker_settings(broker, store_dir)
                async with Bus.of(settings) as bus:
                    await bus.publish_raw("tasks", b"\xc1 broken %d" % i, key=b"same partition")
                await sink_until(settings, store, "SELECT count() FROM dead_letters", i + 1)
        letters = store.query("SELECT uniqExact(event_id), count() FROM dead_letters FINAL").rows
    assert letters == [(2, 2)]
