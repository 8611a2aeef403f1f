"""No poison pills (issue 14, finding 3): what the sink cannot decode, convert or store is
dead-lettered alone with its reason; its neighbours are stored; every Kafka codec is read."""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest
from store_helpers import broker_settings, publish_json, sink_until

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.schemas import TraceNode
from rlbus.schemas.packed import pack_tokens


@pytest.fixture
def broker() -> EmbeddedBroker:
    with EmbeddedBroker() as b:
        yield b


async def test_an_event_the_store_cannot_hold_is_dead_lettered_alone(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """Token ids of 5 bytes are not whole uint32s: that node goes to the dead letters with the
    reason; the nodes polled with it are stored. On main the sink crashed on every restart."""
    settings = broker_settings(broker, tmp_path / "store")
    good = [
        TraceNode(node_id=f"n{i}", rollout_id="r", token_ids=pack_tokens([i, i + 1]))
        for i in range(3)
    ]
    bad = TraceNode(node_id="broken", rollout_id="r", token_ids=b"\x01\x02\x03\x04\x05")
    async with Bus.of(settings) as bus:
        await bus.publish_many([good[0], bad, *good[1:]])
    with open_store(settings.store.url) as store:
        await sink_until(settings, store, "SELECT count() FROM dead_letters", 1)
        nodes = store.query("SELECT node_id FROM trace_nodes FINAL ORDER BY node_id").rows
        (letter,) = store.query("SELECT origin_topic, error, hex(raw) FROM dead_letters FINAL").rows
    assert nodes == [("n0",), ("n1",), ("n2",)]
    assert letter[0] == "trace-nodes" and "token_ids" in letter[1] and bad.event_id in letter[1]
    # One rollout's nodes travel as one message, kept whole; the letter names the bad one's place.
    assert letter[1].startswith("event 1 of the message")
    raw = msgspec.msgpack.decode(bytes.fromhex(letter[2]))
    assert [node["node_id"] for node in raw] == ["n0", "broken", "n1", "n2"]


async def test_out_of_range_numbers_are_dead_lettered_with_the_field_named(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """An integer past Int64 (group_size 2**64) used to crash the sink's Arrow conversion on
    every restart; now the decode refuses it, naming the field, and the next task is stored."""
    settings = broker_settings(broker, tmp_path / "store")
    huge = b'{"task_id": "big", "env": "e", "prompt": "p", "group_size": 18446744073709551616}'
    fine = b'{"task_id": "fine", "env": "e", "prompt": "p"}'
    await publish_json(settings, [huge, fine])
    with open_store(settings.store.url) as store:
        await sink_until(settings, store, "SELECT count() FROM tasks", 1)
        tasks = store.query("SELECT task_id FROM tasks FINAL").rows
        errors = store.query("SELECT error FROM dead_letters FINAL").rows
    assert tasks == [("fine",)]
    assert len(errors) == 1 and "group_size" in errors[0][0]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_every_kafka_codec_is_consumed(
    broker: EmbeddedBroker, tmp_path: Path, codec: str
) -> None:
    """Batches compressed as librdkafka clients send them by default; on main snappy, lz4 and
    zstd stopped `rlbus worker sink` with UnsupportedCodecError on every restart."""
    settings = broker_settings(broker, tmp_path / "store", prefix=f"{codec}.")
    lines = [
        b'{"task_id": "%s-%d", "env": "e", "prompt": "p"}' % (codec.encode(), i) for i in range(20)
    ]
    await publish_json(settings, lines, compression=codec)
    with open_store(settings.store.url) as store:
        landed = await sink_until(settings, store, "SELECT count() FROM tasks FINAL", 20)
    assert landed == 20


async def test_one_id_with_two_contents_is_kept_listed_and_logged_once(
    broker: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A redone computation whose result differs (same id, other content) is never silently
    replaced: both rows stay, the `conflicts` view lists the id, the sink logs it once with
    both origins. A true duplicate (same content, another timestamp) is no conflict."""
    settings = broker_settings(broker, tmp_path / "store")
    first = TraceNode(event_id="same-id", node_id="n", rollout_id="r", role="assistant")
    redone = msgspec.structs.replace(first, role="tool")
    duplicate = msgspec.structs.replace(first, ts=first.ts + 5)
    caplog.set_level(logging.WARNING, logger="rlbus.consumers.sink.sink")
    async with Bus.of(settings) as bus:
        await bus.publish_many([first, duplicate])
        await bus.publish(redone)
        await bus.publish(redone)
    with open_store(settings.store.url) as store:
        await sink_until(settings, store, "SELECT uniqExact(role) FROM trace_nodes", 2)
        roles = store.query("SELECT role FROM trace_nodes FINAL ORDER BY role").rows
        conflicts = store.query("SELECT `table`, event_id, versions FROM conflicts").rows
        store.command("OPTIMIZE TABLE trace_nodes FINAL")
        after_merge = store.query("SELECT count() FROM trace_nodes").rows[0][0]
    assert roles == [("assistant",), ("tool",)] and after_merge == 2
    assert conflicts == [("trace_nodes", "same-id", 2)]
    logged = [r.getMessage() for r in caplog.records if "same-id" in r.getMessage()]
    assert len(logged) == 1 and logged[0].count("offset") == 2, logged
