"""Removing old parts starts no burst of threads (issue 35: the sink's memory crept; migration
0012 says how). Run in a child process: one engine per process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CLEANUP = """
import json, sys, time
from pathlib import Path
from rlbus.bus.store import open_store

def threads():
    return sum(1 for _ in Path("/proc/self/task").iterdir())

with open_store(f"chdb://{sys.argv[1]}") as store:
    # Old parts go as soon as the engine looks (defaults: kept 8 minutes, looked at every 30 s).
    store.command(
        "ALTER TABLE rollouts MODIFY SETTING old_parts_lifetime = 0, cleanup_delay_period = 1, "
        "cleanup_delay_period_random_add = 0"
    )
    store.command("SYSTEM STOP MERGES rollouts")
    for i in range(150):
        store.command(f"INSERT INTO rollouts (run_id, rollout_id) VALUES ('r', 'ro-{i}')")
    before = threads()
    store.command("SYSTEM START MERGES rollouts")
    store.command("OPTIMIZE TABLE rollouts FINAL")
    waited = time.monotonic()
    inactive = "SELECT count() FROM system.parts WHERE table = 'rollouts' AND NOT active"
    while store.query(inactive).rows[0][0] and time.monotonic() - waited < 60:
        time.sleep(0.2)
    left = store.query(inactive).rows[0][0]
    print(json.dumps({"before": before, "after": threads(), "left": left}))
"""


@pytest.mark.slow
def test_removing_old_parts_starts_no_burst_of_threads(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CLEANUP, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["left"] == 0, seen  # the 150 merged parts were removed
    assert seen["after"] <= seen["before"] + 4, seen
