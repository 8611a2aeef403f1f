"""`rlbus broker` and `rlbus topics`: the embedded broker alone, and what is on a broker."""

from __future__ import annotations

import asyncio
import signal
import threading

import typer
from rich.table import Table

from rlbus.bus.lag import Lag
from rlbus.commands.common import OVERRIDES, OVERRIDES_HELP, ConfigOption, fail, settings_from
from rlbus.config import Settings
from rlbus.console import console
from rlbus.discovery import announced_broker, local_broker, require_bootstrap


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
    async with Lag(settings.kafka) as lag:
        every = await lag.partitions(every_topic=True)
        ends = await lag.ends(every)
        behind = await lag.by_topic(every_topic=True)
    partitions: dict[str, int] = {}
    messages: dict[str, int] = {}
    for tp in every:
        partitions[tp.topic] = partitions.get(tp.topic, 0) + 1
        messages[tp.topic] = messages.get(tp.topic, 0) + ends[tp]
    topics = Table(title=f"topics on {bootstrap}")
    for col in ("topic", "partitions", "messages (end offsets)"):
        topics.add_column(col, justify="right" if col != "topic" else "left")
    for name in sorted(partitions):
        topics.add_row(name, str(partitions[name]), f"{messages[name]:,}")
    groups = Table(title="consumer groups of rlbus roles")
    for col in ("group", "topic", "committed", "lag"):
        groups.add_column(col, justify="right" if col in ("committed", "lag") else "left")
    prefix = settings.kafka.topic_prefix
    for group, by_topic in sorted(behind.items()):
        for topic, (committed, messages_behind) in by_topic.items():
            name = topic.removeprefix(prefix)
            groups.add_row(prefix + group, name, f"{committed:,}", f"{messages_behind:,}")
    return topics, groups


def topics(ctx: typer.Context, config: ConfigOption = None) -> None:
    """List topics with partition counts and end offsets, and the committed offsets and lag of
    every consumer group on them (every role of every run, and users' own consumers)."""
    settings = require_bootstrap(settings_from(ctx, config))
    for table in asyncio.run(_describe(settings)):
        console.print(table)


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(broker)
    app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(topics)
