"""The broker's life is visible (issue 14, findings 7 and 8): whatever starts Tansu stops it,
however it is stopped or dies; a broker death is reported by every role in one line, and they
still stop promptly; commands reuse an announced broker and never overwrite or delete another
process's announcement."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.pids import alive

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings, load_settings
from rlbus.discovery import BROKER_FILE, store_served_elsewhere
from rlbus.launch.local_sink import LocalSink
from rlbus.launch.processes import RoleProcess
from rlbus.schemas import Event, TaskPublished


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def rlbus(args: list[str], data: Path, **kwargs: object) -> subprocess.Popen:
    env = {**os.environ, "RLBUS_STORE__URL": f"chdb://{data}", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "rlbus", *args],
        env=env,
        cwd=data.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kwargs,
    )


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int, Path]]:
    """`rlbus broker` running: its process, its Tansu's PID, the data directory."""
    data = tmp_path / "data"
    process = rlbus(["broker"], data)
    announcement = data / BROKER_FILE
    try:
        wait_for(announcement.exists, 60, "rlbus broker's announcement")
        (tansu,) = children(process.pid)
        yield process, tansu, data
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
@pytest.mark.slow
def test_rlbus_broker_stops_tansu_and_withdraws_its_announcement(
    standalone: tuple[subprocess.Popen, int, Path], sig: signal.Signals
) -> None:
    process, tansu, data = standalone
    process.send_signal(sig)
    assert process.wait(30) == 0  # generous: a loaded 2-core machine starts and stops slowly
    wait_for(lambda: not alive(tansu), 5, f"Tansu {tansu} to be gone")
    assert not (data / BROKER_FILE).exists()


@pytest.mark.slow
def test_killing_rlbus_broker_takes_tansu_with_it(
    standalone: tuple[subprocess.Popen, int, Path],
) -> None:
    process, tansu, data = standalone
    process.kill()
    process.wait()
    wait_for(lambda: not alive(tansu), 5, f"Tansu {tansu} to die with its parent")
    from rlbus.discovery import announced_broker

    stale = load_settings(overrides={"store": {"url": f"chdb://{data}"}})
    assert announced_broker(stale) is None  # the file is left, but names a dead owner


@pytest.mark.slow
def test_rlbus_broker_says_when_tansu_dies(standalone: tuple[subprocess.Popen, int, Path]) -> None:
    process, tansu, data = standalone
    os.kill(tansu, signal.SIGKILL)
    assert process.wait(15) == 1
    output = process.stdout.read().decode()
    assert f"Tansu (process {tansu}) died" in output
    assert not (data / BROKER_FILE).exists()


@pytest.mark.slow
def test_commands_reuse_the_announced_broker(
    standalone: tuple[subprocess.Popen, int, Path],
) -> None:
    """docs/commands.md's recipe: `rlbus broker` running, then other commands. On main each
    started a broker of its own, overwrote the announcement and deleted it on exit."""
    process, tansu, data = standalone
    announced = (data / BROKER_FILE).read_text()
    small = ["--teacher-tasks", "16", "--sft-steps", "1", "--max-steps", "1"]
    quick = rlbus(["quickstart", *small, "--orchestrator.eval-tasks", "8"], data)
    out = quick.communicate(timeout=400)[0].decode()
    assert quick.returncode == 0, out
    address = announced.split()[0]
    assert f"broker {address}" in out
    assert (data / BROKER_FILE).read_text() == announced and alive(tansu)
    assert children(process.pid) == [tansu]


async def publish(settings: Settings, *events: Event) -> None:
    async with Bus.of(settings) as bus:
        await bus.publish_many(list(events))


@pytest.mark.slow
def test_roles_report_a_dead_broker_in_one_line_and_still_stop_promptly(tmp_path: Path) -> None:
    broker = EmbeddedBroker().start()
    settings = load_settings(
        overrides={
            "kafka": {"bootstrap_servers": broker.bootstrap_servers},
            "store": {"url": f"chdb://{tmp_path / 'store'}"},
            "claim_check": {"url": str(tmp_path / "claims")},
        }
    )
    sink = RoleProcess("sink", settings, tmp_path / "logs")
    try:
        # Consuming for real: a task it stored.
        asyncio.run(publish(settings, TaskPublished(task_id="t", env="e", prompt="p")))
        landed = lambda: LocalSink(settings, sink).count("SELECT count() FROM tasks", {}) == 1  # noqa: E731
        wait_for(lambda: store_served_elsewhere(settings) and landed(), 90, "the sink to store")
        os.kill(broker.pid, signal.SIGKILL)
        # When it comes is bus/health.py's settings (DOWN_AFTER checks, CHECK_EVERY_S apart);
        # the limit here only stops a sink that never says so from hanging the test.
        wait_for(lambda: "unreachable since" in sink.log_tail(200), 60, "the sink to report it")
        reports = [line for line in sink.log_path.read_text().splitlines() if "unreachable" in line]
        assert len(reports) == 1, reports
        sink.proc.send_signal(signal.SIGTERM)
        # Every close and commit is bounded (bus.STOP_TIMEOUT_S, bus.commits.COMMIT_TIMEOUT_S)
        # where the Kafka client alone would retry the dead broker: a sink that waits for it
        # fails here (TimeoutExpired) instead of hanging.
        sink.proc.wait(30)
    finally:
        sink.kill() if sink.alive() else None
        broker.stop()


@pytest.mark.slow
async def test_what_a_dead_broker_took_is_counted_exactly(tmp_path: Path) -> None:
    """Every process writes what the broker acknowledged to it; what the sink stored is in the
    store's kafka_offset columns: a dead embedded broker's loss is the difference, per topic."""
    from rlbus.bus.store import open_store
    from rlbus.consumers.sink.sink import run_sink
    from rlbus.launch.broker_losses import unstored

    started = time.time()
    with EmbeddedBroker() as broker:
        settings = load_settings(
            overrides={
                "kafka": {
                    "bootstrap_servers": broker.bootstrap_servers,
                    "ack_ledger": str(tmp_path / "acks"),
                },
                "store": {"url": f"chdb://{tmp_path / 'store'}", "flush_interval_s": 0.2},
                "claim_check": {"url": str(tmp_path / "claims")},
            }
        )
        tasks = [TaskPublished(task_id=f"t{i}", env="e", prompt="p") for i in range(30)]
        await publish(settings, *tasks[:20])
        with open_store(settings.store.url) as store:
            stop = asyncio.Event()
            sink = asyncio.create_task(run_sink(settings, store, stop))
            count = "SELECT count() FROM tasks FINAL"
            while store.query(count).rows[0][0] < 20:
                await asyncio.sleep(0.2)
            stop.set()
            await sink
            await publish(settings, *tasks[20:])  # acknowledged, never stored: the broker "dies"
            lost = unstored(store, tmp_path / "acks", settings.kafka.topic_prefix, started)
    assert lost == {"tasks": 10}
