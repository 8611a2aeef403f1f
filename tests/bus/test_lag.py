"""Consumer lag (bus.lag) on the real embedded broker: end offsets minus committed offsets, per
group, over the partitions it commits in; groups that committed nothing are not listed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from support.isolated import isolated_settings
from support.sinks import publish

from rlbus.bus import EmbeddedBroker
from rlbus.bus.broker_handover import commit_offsets
from rlbus.bus.lag import Lag
from rlbus.config import Settings, settings_variables
from rlbus.schemas import TOPICS, TrainStep

TOPIC_NAMES = [topic.name for topic in TOPICS]


def rlbus_topics(settings: Settings) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """`rlbus topics` run as a user runs it (exit 0 asserted), and its tables' rows as cells."""
    shown = subprocess.run(
        [sys.executable, "-m", "rlbus", "topics"],
        env={**os.environ, **settings_variables(settings), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    lines = shown.stdout.splitlines()
    return shown, [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines]


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
    shown, rows = rlbus_topics(settings)
    steps = settings.kafka.topic_prefix + "steps"
    assert [steps, str(settings.kafka.partitions), "10"] in rows, shown.stdout
    assert [settings.kafka.topic_prefix + "trainer.r", "steps", "4", "6"] in rows, shown.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rlbus_topics_answers_on_a_broker_of_many_topics_most_of_them_empty(
    tmp_path: Path,
) -> None:
    """A broker of 600 topics, one in six holding a message (the test suite's session broker,
    a shared cluster). Asked for offsets of topics missing from its metadata, aiokafka's reader
    fetches metadata for one more topic per round trip: after the reader had been pointed at the
    topics holding messages, `rlbus topics` gave up after 40 s on the empty ones
    ("KafkaTimeoutError: Failed to get offsets by times", CI of 896f71c)."""
    names = [f"other{i}.{topic}" for i in range(60) for topic in TOPIC_NAMES]

    async def fill(bootstrap: str) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            for start in range(0, len(names), 100):
                await admin.create_topics([NewTopic(n, 2, 1) for n in names[start : start + 100]])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for name in names[::6]:
                await producer.send(name, b"event")
        finally:
            await producer.stop()

    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as broker:
        asyncio.run(fill(broker.bootstrap_servers))
        shown, rows = rlbus_topics(isolated_settings(broker, tmp_path))
    assert ["other0.tasks", "2", "1"] in rows, shown.stdout[-2000:]
    assert ["other59.steps", "2", "0"] in rows, shown.stdout[-2000:]
