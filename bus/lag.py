"""How far behind consumer groups are: end offsets minus committed offsets, read from the broker
with an admin client and an unassigned reader. `rlbus run` samples it for the store
(launch/run_health.py); bench/soak.py watches it grow.

    async with Lag(settings.kafka) as lag:
        behind = await lag.groups()  # {"judge.RUN.reverse_text": 12, "sink": 0, ...}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from rlbus.bus.connection import client_options
from rlbus.config import KafkaConfig


class Behind(NamedTuple):
    """A group on one topic: the offsets it committed (summed over partitions) and the messages
    after them."""

    committed: int
    messages: int


class Lag:
    """Every consumer group's lag on the broker, over rlbus's topics (those under the prefix)."""

    def __init__(self, kafka: KafkaConfig):
        self.kafka = kafka
        self.admin = AIOKafkaAdminClient(**client_options(kafka))
        self.reader = AIOKafkaConsumer(**client_options(kafka), enable_auto_commit=False)

    async def __aenter__(self) -> Lag:
        await self.admin.start()
        await self.reader.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.reader.stop()
        await self.admin.close()

    async def partitions(self, every_topic: bool = False) -> list[TopicPartition]:
        """Every partition of rlbus's topics (`every_topic`: of every topic but the broker's
        internal ones)."""
        prefix = "" if every_topic else self.kafka.topic_prefix
        listed = await self.admin.list_topics()
        topics = [t for t in listed if t.startswith(prefix) and not t.startswith("__")]
        if not topics:
            return []
        return [
            TopicPartition(described["topic"], p["partition"])
            for described in await self.admin.describe_topics(topics)
            for p in described["partitions"]
        ]

    def _following(self, tps: list[TopicPartition]) -> AIOKafkaConsumer:
        """The reader, assigned `tps`, so that one metadata fetch covers all their topics.
        Asked for offsets on topics its metadata lacks, aiokafka's reader fetches metadata for
        one more of them per round trip: on a broker of hundreds of topics, past its 40 s."""
        self.reader.assign(tps)
        return self.reader

    async def reported_ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's end offset as the broker reports it (see `ends`)."""
        return await self._following(tps).end_offsets(tps)

    async def starts(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's oldest offset still held."""
        return {
            tp: start or 0
            for tp, start in (await self._following(tps).beginning_offsets(tps)).items()
        }

    async def ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's end offset. Tansu 0.6 reports the first offset of a partition's
        last batch + 1 as its end, so that batch is fetched and its last offset taken."""
        reported = await self.reported_ends(tps)
        ends = dict(reported)
        fetch = [tp for tp in tps if reported[tp] > 0]
        self.reader.assign(fetch)
        for tp in fetch:
            self.reader.seek(tp, reported[tp] - 1)
        left = set(fetch)
        while left:
            for tp, records in (await self.reader.getmany(*left, timeout_ms=1000)).items():
                if records:
                    ends[tp] = records[-1].offset + 1
                    left.discard(tp)
        return ends

    async def events(self) -> int:
        """Messages on rlbus's topics so far."""
        return sum((await self.ends(await self.partitions())).values())

    async def committed(
        self, every: list[TopicPartition], wanted: Callable[[str], bool] | None = None
    ) -> dict[str, dict[TopicPartition, int]]:
        """Each group's committed offsets on `every` (the groups `wanted` says yes to, by their
        name on the broker; default: all)."""
        committed: dict[str, dict[TopicPartition, int]] = {}
        for group, _ in await self.admin.list_consumer_groups():
            if wanted is None or wanted(group):
                # Partitions named: Tansu 0.6's answer to "all of the group's" is one aiokafka
                # cannot decode.
                offsets = await self.admin.list_consumer_group_offsets(group, partitions=every)
                committed[group] = {
                    tp: meta.offset
                    for tp, meta in offsets.items()
                    if meta.offset is not None and meta.offset >= 0
                }
        return committed

    async def by_topic(
        self, wanted: Callable[[str], bool] | None = None, every_topic: bool = False
    ) -> dict[str, dict[str, Behind]]:
        """For each group that has committed anything (of those `wanted` says yes to, by its name
        without the prefix; default: all), on each topic it committed in: what it committed and
        how many messages it is behind. Groups are named without the prefix, topics with it;
        `every_topic`: on every topic of the broker, not rlbus's alone."""
        prefix = self.kafka.topic_prefix
        every = await self.partitions(every_topic)

        def ours(group: str) -> bool:
            name = group.removeprefix(prefix)
            return group.startswith(prefix) and (wanted is None or wanted(name))

        committed = {
            group.removeprefix(prefix): offsets
            for group, offsets in (await self.committed(every, ours)).items()
        }
        # Ends after commits: a commit read later than an end could pass it.
        ends = await self.ends(every)
        starts = await self.starts(every)
        out: dict[str, dict[str, Behind]] = {}
        for group, offsets in committed.items():
            # A partition of a topic the group committed in, with no commit yet, is behind by
            # all it holds.
            for topic in sorted({tp.topic for tp in offsets}):
                held = [tp for tp in every if tp.topic == topic]
                done = sum(offsets[tp] for tp in held if tp in offsets)
                behind = sum(ends[tp] - offsets.get(tp, starts[tp]) for tp in held)
                out.setdefault(group, {})[topic] = Behind(done, behind)
        return out

    async def groups(self, wanted: Callable[[str], bool] | None = None) -> dict[str, int]:
        """Messages behind by group (named without the prefix), for each group that has
        committed anything (of those `wanted` says yes to, by name; default: all)."""
        return {
            group: sum(b.messages for b in topics.values())
            for group, topics in (await self.by_topic(wanted)).items()
        }
