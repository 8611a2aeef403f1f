"""Two sinks on one chdb store (`rlbus run`'s `sinks = 2` on the embedded default): started at
once, one holds the directory and the other waits as a standby; when the holder is SIGKILLed
mid-stream the standby takes the store over and every event lands exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.factories import make_event

from rlbus.bus import Bus
from rlbus.bus.store import StoreLockedError, open_store
from rlbus.bus.store.holder import holder_pid
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings, data_dir
from rlbus.discovery import store_served_elsewhere
from rlbus.launch.processes import RoleProcess
from rlbus.schemas import TokenRecord

TOTAL = 40_000


def stored(settings: Settings, final: bool) -> int:
    """Token rows of the run, read through the holder's endpoint (0 while none serves)."""
    if not store_served_elsewhere(settings):
        return 0
    try:
        with open_store(settings.store.url, read_only=True) as store:
            sql = (
                f"SELECT count() FROM tokens{' FINAL' if final else ''} WHERE run_id = {{r:String}}"
            )
            return int(store.query(sql, {"r": settings.run_id}).rows[0][0])
    except Exception:  # the holder went away between the check and the query
        return 0


def test_a_standby_sink_takes_the_store_over_and_loses_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    small_batches = settings.model_copy(
        update={"store": settings.store.model_copy(update={"batch_rows": 500})}
    )
    events = [make_event(TokenRecord, i, settings.run_id) for i in range(TOTAL)]
    sinks = [
        RoleProcess("sink", small_batches, tmp_path / "logs", name=f"sink-{k}") for k in (1, 2)
    ]
    try:
        wait_for(lambda: store_served_elsewhere(settings), 60, "a sink to hold the store")

        async def publish() -> None:
            async with Bus.of(settings) as bus:
                for start in range(0, TOTAL, 5000):
                    await bus.publish_many(events[start : start + 5000])

        asyncio.run(publish())
        wait_for(lambda: stored(settings, final=False) > 2_000, 120, "progress", interval_s=0.1)
        directory = data_dir(settings).resolve()
        (holder,) = [s for s in sinks if s.proc.pid == holder_pid(directory)]
        (standby,) = [s for s in sinks if s is not holder]
        assert standby.alive(), standby.log_tail()  # it waited rather than failing
        assert "waits as a standby" in standby.log_path.read_text()
        holder.kill()
        wait_for(lambda: holder_pid(directory) == standby.proc.pid, 60, "the standby to take over")
        wait_for(lambda: stored(settings, final=True) >= TOTAL, 240, "every event")
        with open_store(settings.store.url, read_only=True) as store:
            rows, distinct = store.query(
                "SELECT count(), uniqExact(event_id) FROM tokens FINAL WHERE run_id = {r:String}",
                {"r": settings.run_id},
            ).rows[0]
    finally:
        for sink in sinks:
            sink.stop()
    assert (rows, distinct) == (TOTAL, TOTAL)


def test_a_store_taken_between_the_probe_and_the_open_is_reported_as_held(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sinks started at once may both find the directory free; the engine then refuses
    the later one. That must read as the store being held (so it waits as a standby), not as
    a failure of the engine."""
    import rlbus.bus.store.client as client

    holder = RoleProcess("sink", settings, tmp_path / "logs")
    try:
        wait_for(lambda: store_served_elsewhere(settings), 60, "the sink to hold the store")
        probes = iter([None])  # the first probe ran just before the holder took the lock
        real = client.holder_pid
        monkeypatch.setattr(client, "holder_pid", lambda d: next(probes, real(d)))
        with pytest.raises(StoreLockedError, match=f"process {holder.proc.pid}"):
            open_store(settings.store.url)
    finally:
        holder.stop()
