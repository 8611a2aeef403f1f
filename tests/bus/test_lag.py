"""Consumer lag (bus.lag) on the real embedded broker: end offsets minus committed offsets, per
group, over the partitions it commits in; groups that committed nothing are not listed."""

from __future__ import annotations

from aiokafka import TopicPartition
from support.sinks import publish

from rlbus.bus.broker_handover import commit_offsets
from rlbus.bus.lag import Lag
from rlbus.config import Settings
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
