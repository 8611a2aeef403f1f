"""Consumer lag (bus.lag) on the real embedded broker: end offsets minus committed offsets, per
group, over the partitions it commits in; groups that committed nothing are not listed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from aiokafka import TopicPartition
from support.sinks import publish

from rlbus.bus.broker_handover import commit_offsets
from rlbus.bus.lag import Lag
from rlbus.config import Settings, settings_variables
from rlbus.schemas import TrainStep


async def commit(settings: Settings, group: str, offsets: dict[TopicPartition, int]) -> None:
    await commit_offsets(settings.kafka, settings.kafka.topic_prefix + group, offsets)


async def test_lag_is_what_each_group_has_not_committed(settings: Settings) -> None:
    # One key: every step on one partition of `steps`, published one at a time (several batches:
    # Tansu reports a partition's end by its last batch).
    for step in range(10):
        await publish(settings, [TrainStep(run_id="r", step=step)])
    async with Lag(settings.kafka) as lag:
        steps = settings.kafka.topic_prefix + "steps"
        written = [tp for tp in await lag.partitions() if tp.topic == steps]
        ends = await lag.ends(written)
        (held,) = [tp for tp in written if ends[tp] > 0]
        assert ends[held] == 10
        await commit(settings, "trainer.r", {held: 4})
        await commit(settings, "sink", {held: 10})
        assert await lag.groups() == {"trainer.r": 6, "sink": 0}
        assert await lag.groups(lambda group: group == "sink") == {"sink": 0}
        assert await lag.events() >= 10


def test_rlbus_topics_counts_what_a_batch_put_on_the_broker_and_who_is_behind(
    settings: Settings,
) -> None:
    """Ten steps published in one batch: Tansu 0.6 reports that partition's end as 1 (the
    batch's first offset + 1); `rlbus topics` shows the ten, and a group that committed four of
    them six behind, as Lag does."""
    asyncio.run(publish(settings, [TrainStep(run_id="r", step=step) for step in range(10)]))

    async def commit_four() -> None:
        async with Lag(settings.kafka) as lag:
            steps = settings.kafka.topic_prefix + "steps"
            written = [tp for tp in await lag.partitions() if tp.topic == steps]
            (held,) = [tp for tp, end in (await lag.ends(written)).items() if end > 0]
        await commit(settings, "trainer.r", {held: 4})

    asyncio.run(commit_four())
    shown = subprocess.run(
        [sys.executable, "-m", "rlbus", "topics"],
        env={**os.environ, **settings_variables(settings), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in shown.stdout.splitlines()]
    steps = settings.kafka.topic_prefix + "steps"
    assert [steps, str(settings.kafka.partitions), "10"] in rows, shown.stdout
    assert [settings.kafka.topic_prefix + "trainer.r", "steps", "4", "6"] in rows, shown.stdout
