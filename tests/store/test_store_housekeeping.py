"""ClickHouse's own system logs stay out of the way: the embedded store never creates them, and
deploy/clickhouse/system-logs.xml (the config.d snippet for a server) removes them or gives them
a TTL when merged over a config that enables them, in the ClickHouse engine itself (chdb, in a
child process: one engine per process)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support.factories import make_event

from rlbus.bus.store import open_store
from rlbus.schemas import EVENT_TYPES

SNIPPET = Path(__file__).resolve().parents[2] / "deploy" / "clickhouse" / "system-logs.xml"

LOGS = "SELECT name FROM system.tables WHERE database = 'system' AND engine NOT LIKE 'System%'"
"""System log tables are MergeTree tables; the built-in system tables are System* engines."""


@pytest.mark.slow
def test_the_embedded_store_writes_no_system_logs(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'store'}"
    with open_store(url) as store:
        for i, kind in enumerate(EVENT_TYPES):
            events = [make_event(kind, j, run_id="r1") for j in range(20)]
            store.insert_events(events, [(0, 20 * i + j) for j in range(20)], f"t{i}")
        for _ in range(5):
            assert store.query("SELECT count() FROM rollouts FINAL").rows[0][0] == 20
        with open_store(url, read_only=True) as reader:  # the read path, guard included
            assert reader.query("SELECT count() FROM scored FINAL").rows[0][0] == 20
        store.query("SYSTEM FLUSH LOGS")
        assert store.query(LOGS).rows == []
        for table in ("query_log", "trace_log", "metric_log", "part_log", "text_log"):
            exists = (
                f"SELECT count() FROM system.tables WHERE database = 'system' AND name = '{table}'"
            )
            assert store.query(exists).rows[0][0] == 0, table


ENGINE = """
import json, sys, chdb
connection = chdb.connect(f"file:{sys.argv[1]}?config-file={sys.argv[2]}")
connection.query("CREATE TABLE t (x UInt64) ENGINE = MergeTree ORDER BY x")
connection.query("INSERT INTO t SELECT number FROM numbers(1000)")
for _ in range(3):
    connection.query("SELECT sum(x) FROM t")
connection.query("SYSTEM FLUSH LOGS")
rows = connection.query(sys.argv[3] + " FORMAT JSONCompactEachRow").bytes().decode().split()
ttl = "SELECT engine_full FROM system.tables WHERE database = 'system' AND name = 'query_log'"
print(json.dumps({"logs": [json.loads(r)[0] for r in rows],
                  "ttl": connection.query(ttl, "TSVRaw").bytes().decode()}))
"""


def _engine_logs(tmp_path: Path, name: str, snippet: Path | None) -> dict:
    """The system log tables a ClickHouse engine creates from a config that enables every log
    the snippet names (as a server's config.xml does), with `snippet` in its config.d."""
    home = tmp_path / name
    (home / "config.d").mkdir(parents=True)
    logs = [e.tag for e in ET.parse(SNIPPET).getroot()]
    enabled = "".join(
        f"<{t}><database>system</database><table>{t}</table>"
        f"<flush_interval_milliseconds>500</flush_interval_milliseconds></{t}>"
        for t in logs
    )
    (home / "config.xml").write_text(f"<clickhouse>{enabled}</clickhouse>")
    if snippet is not None:
        (home / "config.d" / snippet.name).write_text(snippet.read_text())
    done = subprocess.run(
        [sys.executable, "-c", ENGINE, str(home / "db"), str(home / "config.xml"), LOGS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_server_snippet_removes_or_ttls_every_system_log(tmp_path: Path) -> None:
    enabled = _engine_logs(tmp_path, "without", None)
    # The baseline is what a server's defaults do: the logs are there and written.
    assert {"query_log", "trace_log", "metric_log", "asynchronous_metric_log"} <= set(
        enabled["logs"]
    ), enabled
    kept = _engine_logs(tmp_path, "with", SNIPPET)
    assert kept["logs"] == ["query_log"], kept
    assert "TTL event_date + toIntervalDay(7)" in kept["ttl"]
