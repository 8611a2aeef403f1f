"""`rlbus run`'s health publisher (rlbus.launch.run_health) on the real embedded broker, into the
real store through a sink process: memory and lag samples and incidents land (one recorded
before it started, one while it was held for a broker handover), and the run's page shows the
memory chart with its unit and the incidents' rows. A broker that cannot be reached is said
once and stops nothing."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path

import httpx
import pytest
from support.sinks import publish, start_sink

from rlbus.bus import EmbeddedBroker
from rlbus.bus.server_thread import ServerThread
from rlbus.bus.store import open_store
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings, load_settings
from rlbus.config.runs import HealthConfig
from rlbus.launch.processes import alive, rss_bytes
from rlbus.launch.run_health import RunHealth, serves
from rlbus.schemas import RolloutCompleted
from rlbus.ui.app import create_app

ROTATION = "rss 812 MB > 768 MB; 1,204 messages carried; paused 14.2 s"
LANDED = (
    "SELECT (SELECT count() FROM health_samples WHERE run_id = {run:String} "
    "AND has(mapKeys(lag), 'sink') AND has(mapKeys(rss_mib), 'broker')) >= 2 "
    "AND (SELECT count() FROM incidents WHERE run_id = {run:String}) = {incidents:UInt8} "
    "AND (SELECT count() FROM rollouts WHERE run_id = {run:String}) = 1"
)
"""Two samples taken once the sink had committed (its lag is in them), the incidents, the run."""
RESTARTED = "restarted on the new broker"


def test_samples_and_incidents_land_and_the_run_page_shows_them(
    settings: Settings, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    run = settings.run_id
    sink = start_sink(settings, tmp_path / "logs")
    assert broker.pid is not None
    pids = {"sink": sink.proc.pid, "broker": broker.pid}
    health = RunHealth(run, HealthConfig(sample_every_s=0.5), lambda: pids)
    health.incident("broker-rotation", ROTATION)  # before start: goes out once it has started
    health.start(settings)
    try:
        rollout = RolloutCompleted(run_id=run, rollout_id="r1", group_id="g", task_id="t", env="e")
        asyncio.run(publish(settings, [rollout]))
        with open_store(settings.store.url, read_only=True) as store:
            wait_for(
                lambda: store.query(LANDED, {"run": run, "incidents": 1}).rows[0][0],
                30,
                "the samples and the incident in the store",
                check=alive(sink),
            )
            # A handover: held while the broker moves, then on the new one (the same, here).
            health.hold()
            health.incident("role-restarted", RESTARTED, "judge")
            time.sleep(1.0)  # held: nothing goes out, the sink would have stored it by now
            assert store.query(LANDED, {"run": run, "incidents": 1}).rows[0][0]
            health.move(settings.model_copy())
            wait_for(
                lambda: store.query(LANDED, {"run": run, "incidents": 2}).rows[0][0],
                30,
                "the incident recorded while held",
                check=alive(sink),
            )
            sink_mib, lag = store.query(
                "SELECT rss_mib['sink'], lag FROM health_samples WHERE run_id = {run:String} "
                "ORDER BY ts DESC LIMIT 1",
                {"run": run},
            ).rows[0]
            incident = store.query(
                "SELECT incident, detail, process FROM incidents WHERE run_id = {run:String} "
                "ORDER BY ts",
                {"run": run},
            ).rows
    finally:
        health.stop()
    now = rss_bytes(sink.proc.pid)
    assert now is not None and 0.5 < sink_mib * 2**20 / now < 2  # the sink's own, in MiB
    assert set(lag) == {"sink"}  # the only group of this run on the broker: the sink's
    assert incident == [("broker-rotation", ROTATION, ""), ("role-restarted", RESTARTED, "judge")]
    try:
        with ServerThread(create_app(settings.store.url), lifespan="on") as ui:
            page = httpx.get(f"{ui.url}/runs/{run}", timeout=60).text
    finally:
        sink.stop()
    memory = re.search(r'<figure id="chart-memory">(.*?)</figure>', page, re.S)
    assert memory is not None and ">resident memory (MiB)</text>" in memory.group(1)
    assert "broker ·" in memory.group(1) and "sink ·" in memory.group(1)
    table = re.search(r'<table class="nav" id="incidents-table">.*?</table>', page, re.S)
    assert table is not None and "<td>broker-rotation</td>" in table.group(0)
    assert f"<td>{RESTARTED}</td>" in table.group(0)


def test_a_runs_lag_is_of_its_own_groups_and_the_sinks() -> None:
    wanted = serves("r1")
    assert all(wanted(g) for g in ("sink", "judge.r1.e", "trainer.r1", "orchestrator-leader.r1"))
    assert not any(wanted(g) for g in ("trainer.r10", "orchestrator.r2", "env.r2.r1"))


def test_an_unreachable_broker_is_said_once_and_stops_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(
        overrides={
            "kafka": {"bootstrap_servers": "127.0.0.1:1"},
            "claim_check": {"url": str(tmp_path / "claims")},
        }
    )
    health = RunHealth("r", HealthConfig(sample_every_s=0.1), lambda: {"me": 1})
    with caplog.at_level(logging.WARNING, logger="rlbus.launch.run_health"):
        health.start(settings)
        for n in range(3):
            health.incident("role-exited", f"env exited with code {n}", "env")
        time.sleep(1.5)
        started = time.monotonic()
        health.stop()
    assert time.monotonic() - started < 5
    said = [r.getMessage() for r in caplog.records if r.name == "rlbus.launch.run_health"]
    assert len(said) == 1 and "cannot reach the broker" in said[0], said
