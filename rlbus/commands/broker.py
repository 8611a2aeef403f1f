"""`rlbus broker` and `rlbus topics`: the embedded broker alone, and what is on a broker."""

from __future__ import annotations

import asyncio
import time

import typer
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from rich.table import Table

from rlbus.commands.common import OVERRIDES, OVERRIDES_HELP, ConfigOption, console, settings_from
from rlbus.config import Settings
from rlbus.runtime import local_broker, require_bootstrap


def broker(ctx: typer.Context, config: ConfigOption = None) -> None:
    """Start the embedded Kafka-protocol broker (Tansu) alone and print its address.

    Other rlbus commands on this machine find it without configuration; other tools use
    the printed bootstrap address. Data is in memory: it is gone when this stops.
    """
    settings = settings_from(ctx, config)
    if settings.kafka.bootstrap_servers:
        raise typer.BadParameter("kafka.bootstrap_servers is set: there is a broker already")
    with local_broker(settings) as live:
        console.print(f"embedded broker listening; bootstrap servers: [bold]{live.kafka.bootstrap_servers}[/bold]")
        console.print("Ctrl-C to stop")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            console.print("stopped")


async def _describe(settings: Settings) -> tuple[Table, Table]:
    bootstrap = settings.kafka.bootstrap_servers
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await admin.start()
    await consumer.start()
    try:
        names = sorted(t for t in await consumer.topics() if not t.startswith("__"))
        partitions = {t: sorted(consumer.partitions_for_topic(t) or ()) for t in names}
        tps = [TopicPartition(t, p) for t, ps in partitions.items() for p in ps]
        ends = await consumer.end_offsets(tps) if tps else {}
        topics = Table(title=f"topics on {bootstrap}")
        for col in ("topic", "partitions", "messages (end offsets)"):
            topics.add_column(col, justify="right" if col != "topic" else "left")
        for t in names:
            topics.add_row(t, str(len(partitions[t])), f"{sum(ends.get(TopicPartition(t, p), 0) for p in partitions[t]):,}")
        groups = Table(title="consumer groups")
        for col in ("group", "topic", "committed", "lag"):
            groups.add_column(col, justify="right" if col in ("committed", "lag") else "left")
        for group_id, _protocol in sorted(await admin.list_consumer_groups()):
            offsets = await admin.list_consumer_group_offsets(group_id)
            by_topic: dict[str, tuple[int, int]] = {}
            for tp, meta in offsets.items():
                committed, lag = by_topic.get(tp.topic, (0, 0))
                by_topic[tp.topic] = (committed + max(meta.offset, 0), lag + max(ends.get(tp, 0) - meta.offset, 0))
            for topic, (committed, lag) in sorted(by_topic.items()):
                groups.add_row(group_id, topic, f"{committed:,}", f"{lag:,}")
        return topics, groups
    finally:
        await consumer.stop()
        await admin.close()


def topics(ctx: typer.Context, config: ConfigOption = None) -> None:
    """List topics with partition counts and end offsets, and each consumer group's lag."""
    settings = require_bootstrap(settings_from(ctx, config))
    for table in asyncio.run(_describe(settings)):
        console.print(table)


def register(app: typer.Typer) -> None:
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(broker)
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(topics)



