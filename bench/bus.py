"""Event-log throughput, each figure next to a baseline measured in the same run.

1. pipeline: rlbus publish -> embedded broker -> sink process -> ClickHouse (until every row
   is queryable), vs a bare aiokafka produce-and-consume of the same encoded bytes (the
   broker's own limit here). Both consumers have joined their group before the clock starts.
2. sink: decode + Arrow conversion + insert through the Store as the role runs them, vs a bare
   chdb insert of a prebuilt Arrow table of the same rows (`INSERT ... SELECT * FROM
   Python(tbl)`); then each part alone (decode: records to events; convert: events to the
   Arrow block and its dedup token; insert: the Store's insert of that block) next to it.

    python bench/bus.py [--events 100000] [--tokens 64]

Last line: RESULT pipeline_vs_aiokafka=<ratio> sink_vs_chdb=<ratio>
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import chdb
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from rich.console import Console
from rich.table import Table

from rlbus.bus import Bus, Delivery, EmbeddedBroker
from rlbus.bus.claim_check import ClaimStore
from rlbus.bus.records import CONTENT_TYPE, KIND, from_record
from rlbus.bus.store import open_store
from rlbus.bus.store.client import block_token
from rlbus.bus.subscribers import deliveries_of
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings, load_settings
from rlbus.consumers.sink.sink import Sink, messages_of, storable
from rlbus.discovery import store_served_elsewhere
from rlbus.launch.collector import steady_collector
from rlbus.launch.processes import RoleProcess, alive
from rlbus.schemas import TokenRecord, codec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support
from support.token_records import token_records

console = Console(width=140)


async def bare_aiokafka(bootstrap: str, payloads: list[bytes]) -> float:
    """Seconds to produce all payloads and consume them back, consumer already joined."""
    topic = "bare.tokens"
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        max_batch_size=1024 * 1024,
        max_request_size=4 * 1024 * 1024,
    )
    await producer.start()
    await producer.send_and_wait(topic, b"warm-up")
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id="bare",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    while not await consumer.getmany(timeout_ms=1000):
        pass  # until the group is joined and the warm-up message is in

    async def consume() -> None:
        got = 0
        while got < len(payloads):
            batch = await consumer.getmany(timeout_ms=1000, max_records=2000)
            got += sum(len(records) for records in batch.values())
            await consumer.commit()

    start = time.perf_counter()
    consuming = asyncio.create_task(consume())
    futures = [
        await producer.send(topic, p, key=str(i % 64).encode()) for i, p in enumerate(payloads)
    ]
    await asyncio.gather(*futures)
    await consuming
    elapsed = time.perf_counter() - start
    await consumer.stop()
    await producer.stop()
    return elapsed


def stored(settings: Settings) -> int:
    with open_store(settings.store.url, read_only=True) as store:
        return int(
            store.query(
                "SELECT count() FROM tokens WHERE run_id = {r:String}", {"r": settings.run_id}
            ).rows[0][0]
        )


async def publish(settings: Settings, events: list[TokenRecord]) -> None:
    # Under the collector policy rlbus's own publishers run with (the roles, `rlbus eval`,
    # `rlbus tasks publish`): at CPython's default, collections walking the events and their
    # futures took a fifth of the publishing process's time here.
    with steady_collector():
        async with Bus.of(settings) as bus:
            for i in range(0, len(events), 5000):
                await bus.publish_many(events[i : i + 5000])


def pipeline(settings: Settings, events: list[TokenRecord], logs: Path) -> float:
    """Seconds from the first publish until every row is queryable, sink already joined."""
    sink = RoleProcess("sink", settings, logs)
    try:
        wait_for(lambda: store_served_elsewhere(settings), 60, "the sink", check=alive(sink))
        warm = settings.model_copy(update={"run_id": "warm-up"})
        asyncio.run(publish(warm, token_records(1, 4, "warm-up")))
        wait_for(lambda: stored(warm) == 1, 60, "the warm-up row", check=alive(sink))
        start = time.perf_counter()
        asyncio.run(publish(settings, events))
        wait_for(
            lambda: stored(settings) >= len(events),
            600,
            "all rows",
            interval_s=0.05,
            check=alive(sink),
        )
        return time.perf_counter() - start
    finally:
        sink.stop()


def consumed(payloads: list[bytes], topic: str = "tokens") -> list[ConsumerRecord]:
    """The payloads as the sink's consumer hands them over: records with rlbus's headers."""
    headers = [(CONTENT_TYPE, codec.MSGPACK.encode()), (KIND, b"TokenRecord")]
    return [
        ConsumerRecord(topic, 0, offset, 0, 0, None, raw, None, 0, len(raw), headers)
        for offset, raw in enumerate(payloads)
    ]


def sink_parts(settings: Settings, payloads: list[bytes]) -> dict[str, float]:
    """Rows/s of each part of the sink's handling, of the whole as the role runs it (the next
    poll decoded while one is stored), and of a bare chdb Arrow insert of the same rows; each
    insert into an empty table."""
    # As the role runs (rlbus.commands.common.run_until_signal); the polls are made inside,
    # so, as in the role, the collector still walks them.
    with steady_collector():
        return _sink_parts(settings, payloads)


def _sink_parts(settings: Settings, payloads: list[bytes]) -> dict[str, float]:
    batch = settings.store.batch_rows
    polls = [consumed(payloads[i : i + batch]) for i in range(0, len(payloads), batch)]
    claims = ClaimStore(settings.claim_check)
    with open_store(settings.store.url) as store:
        sink = Sink(store)

        def decode(records: list[ConsumerRecord]) -> list[Delivery]:
            # As the sink's subscriber does: each record's events, a delivery each.
            return [
                d
                for r in records
                for d in deliveries_of("tokens", r, from_record("tokens", r, claims))
            ]

        # Both start from empty tables: the pipeline part's rows (and their background merges)
        # would otherwise weigh on the sink's inserts alone.
        store.command("TRUNCATE TABLE tokens")
        seconds = dict.fromkeys(("decode", "convert", "insert"), 0.0)
        for records in polls:
            started = time.perf_counter()
            deliveries = decode(records)
            decoded = time.perf_counter()
            block, good = storable(deliveries)
            token = block_token(TokenRecord, messages_of(good))
            converted = time.perf_counter()
            store.insert_block(TokenRecord, block, token)
            inserted = time.perf_counter()
            seconds["decode"] += decoded - started
            seconds["convert"] += converted - decoded
            seconds["insert"] += inserted - converted
        blocks = [storable(decode(records))[0] for records in polls]

        store.command("TRUNCATE TABLE tokens")

        async def handle_all() -> None:
            # As the role's batch subscriber does: one event loop (its worker threads and their
            # chdb connections made once), and the next poll decoded while one is stored.
            in_flight: asyncio.Task[None] | None = None
            for records in polls:
                deliveries = decode(records)
                if in_flight is not None:
                    await in_flight
                in_flight = asyncio.create_task(sink.handle(deliveries))
                # The role awaits its next fetch here, which lets the handler hand its block to
                # the insert thread before the next poll is decoded.
                await asyncio.sleep(0)
            if in_flight is not None:
                await in_flight

        started = time.perf_counter()
        asyncio.run(handle_all())
        seconds["sink"] = time.perf_counter() - started

        store.command("CREATE TABLE IF NOT EXISTS tokens_bare AS tokens")
        conn = chdb.connect(str(store.data_dir))
        started = time.perf_counter()
        columns = ", ".join(blocks[0].column_names)
        for tbl in blocks:  # noqa: B007 - chdb's Python() table function reads `tbl` by name
            conn.query(f"INSERT INTO tokens_bare ({columns}) SELECT * FROM Python(tbl)")
        seconds["bare"] = time.perf_counter() - started
        landed = store.query("SELECT count() FROM tokens").rows[0][0]
        bare_landed = store.query("SELECT count() FROM tokens_bare").rows[0][0]
        assert landed == bare_landed == len(payloads), (landed, bare_landed)
    return {part: len(payloads) / s for part, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens per TokenRecord")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        settings = load_settings(
            overrides={
                "run_id": "bench",
                "kafka": {"bootstrap_servers": broker.bootstrap_servers},
                "store": {"url": f"chdb://{tmp}/store"},
                "claim_check": {"url": f"{tmp}/claims"},
            }
        )
        events = token_records(args.events, args.tokens, settings.run_id)
        payloads = [codec.encode(e) for e in events]
        console.print(
            f"{args.events:,} TokenRecords of {args.tokens} tokens, "
            f"{sum(map(len, payloads)) / len(payloads):.0f} bytes each"
        )
        bare_s = asyncio.run(bare_aiokafka(broker.bootstrap_servers, payloads))
        pipe_s = pipeline(settings, events, Path(tmp) / "logs")
        parts = sink_parts(settings, payloads)

    n = args.events
    table = Table(title="event log throughput (same run)")
    for col in ("path", "events/s", "baseline", "baseline events/s", "ratio"):
        table.add_column(col, justify="left" if col in ("path", "baseline") else "right")
    pipeline_ratio = (n / pipe_s) / (n / bare_s)
    table.add_row(
        "publish → broker → sink → ClickHouse",
        f"{n / pipe_s:,.0f}",
        "bare aiokafka produce+consume",
        f"{n / bare_s:,.0f}",
        f"{pipeline_ratio:.2f}",
    )
    bare = parts["bare"]
    for part, what in (
        ("sink", "sink: decode + Arrow + insert"),
        ("decode", "  its decode (records → events)"),
        ("convert", "  its convert (events → Arrow block, token)"),
        ("insert", "  its insert (Store.insert_block)"),
    ):
        table.add_row(
            what,
            f"{parts[part]:,.0f}",
            "bare chdb Arrow insert",
            f"{bare:,.0f}",
            f"{parts[part] / bare:.2f}",
        )
    console.print(table)
    print(
        f"RESULT pipeline_vs_aiokafka={pipeline_ratio:.3f} sink_vs_chdb={parts['sink'] / bare:.3f}"
    )


if __name__ == "__main__":
    main()
