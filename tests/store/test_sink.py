"""The sink as its own process (`rlbus worker sink`) between the real broker and real chdb:
every kind lands exactly once, field for field, and a SIGKILL mid-stream loses nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from support.factories import make_event
from support.sinks import publish, start_sink

from rlbus.bus.store import open_store
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings
from rlbus.launch.processes import RoleProcess, alive
from rlbus.schemas import EVENT_TYPES, TokenRecord

N = 10_000


@pytest.fixture
def sink(settings: Settings, tmp_path: Path) -> Iterator[RoleProcess]:
    process = start_sink(settings, tmp_path / "logs")
    yield process
    process.stop()


def count(settings: Settings, table: str, final: bool = True) -> int:
    with open_store(settings.store.url, read_only=True) as store:
        sql = (
            f"SELECT count() FROM {table}{' FINAL' if final else ''} WHERE run_id = {{run:String}}"
        )
        return int(store.query(sql, {"run": settings.run_id}).rows[0][0])


def test_ten_thousand_of_every_kind_land_exactly_once(
    settings: Settings, sink: RoleProcess
) -> None:
    expected = {
        kind: [make_event(kind, i, settings.run_id) for i in range(N)] for kind in EVENT_TYPES
    }
    everything = [e for events in expected.values() for e in events]
    # At-least-once producers resend: a tenth of each kind again, as a producer retry would.
    resent = [e for events in expected.values() for e in events[: N // 10]]
    asyncio.run(publish(settings, everything + resent))

    def all_landed() -> bool:
        return all(count(settings, kind.table) >= N for kind in EVENT_TYPES)

    wait_for(all_landed, 240, f"{N} events of each kind in ClickHouse", check=alive(sink))
    with open_store(settings.store.url, read_only=True) as store:
        assert store.via is not None  # read through the sink's endpoint, not a second engine
        for kind, events in expected.items():
            stored = store.read_events(
                kind, where="run_id = {run:String}", parameters={"run": settings.run_id}
            )
            assert len(stored) == N, kind.__name__
            by_id = {e.event_id: e for e in stored}
            mismatched = [e.event_id for e in events if by_id.get(e.event_id) != e]
            assert not mismatched, (
                f"{kind.__name__}: {len(mismatched)} differ, e.g. {by_id.get(mismatched[0])!r}"
            )


def test_sink_killed_mid_stream_loses_and_duplicates_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    total = 60_000
    small_batches = settings.model_copy(
        update={
            "store": settings.store.model_copy(update={"batch_rows": 500, "flush_interval_s": 0.05})
        }
    )
    events = [make_event(TokenRecord, i, settings.run_id) for i in range(total)]
    asyncio.run(publish(settings, events))
    first = start_sink(small_batches, tmp_path / "logs")
    wait_for(
        lambda: count(settings, "tokens", final=False) > 2_000,
        120,
        "the sink to make progress",
        interval_s=0.05,
        check=alive(first),
    )
    first.kill()
    # Restart before looking: reading an unheld directory would open it in this process and
    # lock the new sink out (chdb admits one process per directory).
    second = start_sink(small_batches, tmp_path / "logs")
    try:
        at_restart = count(settings, "tokens", final=False)
        assert at_restart < total, "the sink finished before it was killed: nothing was tested"
        wait_for(
            lambda: count(settings, "tokens") >= total,
            180,
            "all tokens after the restart",
            check=alive(second),
        )
        with open_store(settings.store.url, read_only=True) as store:
            final_rows, distinct = store.query(
                "SELECT count(), uniqExact(event_id) FROM tokens FINAL WHERE run_id = {run:String}",
                {"run": settings.run_id},
            ).rows[0]
            stored_ids = {
                row[0]
                for row in store.query(
                    "SELECT event_id FROM tokens FINAL WHERE run_id = {run:String}",
                    {"run": settings.run_id},
                ).rows
            }
    finally:
        second.stop()
    assert (final_rows, distinct) == (total, total)
    assert stored_ids == {e.event_id for e in events}


def test_block_tokens_cannot_be_forged_by_a_checksum_collision() -> None:
    """Anyone may publish to `tasks`, so two different messages of one length whose CRC-32s
    agree (found in a second by brute force) must still make two tokens: the same token would
    have the store drop the second block as a replay of the first."""
    import random
    import zlib

    from rlbus.bus.store.client import block_token

    seen: dict[int, bytes] = {}
    rng = random.Random(0)
    while True:
        message = rng.randbytes(12)
        other = seen.setdefault(zlib.crc32(message), message)
        if other != message:
            break
    assert len(other) == len(message) and zlib.crc32(other) == zlib.crc32(message)
    assert block_token(TokenRecord, [message]) != block_token(TokenRecord, [other])


def test_block_tokens_follow_ids_and_contents_not_offsets() -> None:
    """An embedded broker numbers offsets from 0 on every start while the store persists: the
    dedup token of a block comes from its events' ids and bytes, so a replay is dropped
    wherever it sat and anything new is stored."""
    from rlbus.bus.store.client import block_token
    from rlbus.schemas import codec

    first, second = (make_event(TokenRecord, i) for i in (1, 2))
    changed = msgspec.structs.replace(first, policy_version=first.policy_version + 1)

    def token(*events: TokenRecord) -> str:
        return block_token(TokenRecord, [codec.encode(e) for e in events])

    assert token(first) == token(first)  # a replay, at whatever offset: dropped
    assert token(first) != token(second)  # a new event: stored
    assert token(first) != token(changed)  # new content under the same id: stored (a conflict)
