"""`rlbus broker` and `rlbus topics`: the embedded broker alone, and what is on a broker."""

from __future__ import annotations

import asyncio
import signal
import threading

import typer
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from rich.table import Table

from rlbus.bus.connection import client_options
from rlbus.commands.common import OVERRIDES, OVERRIDES_HELP, ConfigOption, fail, settings_from
from rlbus.config import Settings
from rlbus.console import console
from rlbus.discovery import announced_broker, local_broker, require_bootstrap
from rlbus.schemas import TOPICS


def broker(ctx: typer.Context, config: ConfigOption = None) -> None:
    """Start the embedded Kafka-protocol broker (Tansu) alone and print its address.

    Other rlbus commands on this machine find it without configuration; other tools use
    the printed bootstrap address. Data is in memory: it is gone when this stops (Ctrl-C,
    SIGTERM or SIGHUP), and if Tansu dies this says so and exits.
    """
    settings = settings_from(ctx, config)
    if settings.kafka.bootstrap_servers:
        raise typer.BadParameter("kafka.bootstrap_servers is set: there is a broker already")
    running = announced_broker(settings)
    if running is not None:
        raise fail(f"a broker already runs at {running.address} (process {running.pid})", 1)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    with local_broker(settings) as (live, started):
        assert started is not None
        console.print(f"embedded broker listening (Tansu process {started.pid})")
        console.print(f"bootstrap servers: [bold]{live.kafka.bootstrap_servers}[/bold]")
        console.print("Ctrl-C to stop")
        while not stopping.wait(1.0):
            if not started.alive():
                raise fail(
                    f"Tansu (process {started.pid}) died; everything it held is gone. Its log: "
                    f"{started.log_path}",
                    1,
                )
    console.print("stopped")


async def _describe(settings: Settings) -> tuple[Table, Table]:
    bootstrap = settings.kafka.bootstrap_servers
    admin = AIOKafkaAdminClient(**client_options(settings.kafka))
    consumer = AIOKafkaConsumer(**client_options(settings.kafka))
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
            topics.add_row(
                t,
                str(len(partitions[t])),
                f"{sum(ends.get(TopicPartition(t, p), 0) for p in partitions[t]):,}",
            )
        groups = Table(title="consumer groups of rlbus roles")
        for col in ("group", "topic", "committed", "lag"):
            groups.add_column(col, justify="right" if col in ("committed", "lag") else "left")
        prefix = settings.kafka.topic_prefix
        listed = sorted(g for g, _ in await admin.list_consumer_groups() if g.startswith(prefix))
        ours = [
            TopicPartition(prefix + t.name, p)
            for t in TOPICS
            for p in partitions.get(prefix + t.name, ())
        ]
        for group in listed:
            # Explicit partitions: the embedded broker drops the connection on an
            # all-partitions OffsetFetch.
            offsets = await admin.list_consumer_group_offsets(group, partitions=ours)
            by_topic: dict[str, dict[TopicPartition, int]] = {}
            for tp, meta in offsets.items():
                if meta.offset >= 0:
                    by_topic.setdefault(tp.topic, {})[tp] = meta.offset
            for name, committed in sorted(by_topic.items()):
                # Clamped: Tansu 0.6 reports a batch-produced partition's end offset as its
                # last batch's base offset + 1, below what consumers have committed.
                tps = [TopicPartition(name, p) for p in partitions[name]]
                lag = sum(max(0, ends.get(tp, 0) - committed.get(tp, 0)) for tp in tps)
                topic = name[len(prefix) :]
                groups.add_row(group, topic, f"{sum(committed.values()):,}", f"{lag:,}")
        return topics, groups
    finally:
        await consumer.stop()
        await admin.close()


def topics(ctx: typer.Context, config: ConfigOption = None) -> None:
    """List topics with partition counts and end offsets, and the committed offsets and lag of
    every consumer group on them (every role of every run, and users' own consumers)."""
    settings = require_bootstrap(settings_from(ctx, config))
    for table in asyncio.run(_describe(settings)):
        console.print(table)


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(broker)
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(topics)
