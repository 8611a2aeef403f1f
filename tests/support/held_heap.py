"""The anonymous memory a script's work leaves its process holding, read in a fresh process: a
heap no other test has used. The script calls `anon_mb()` (defined ahead of it here) and prints
`HEAP BEFORE_MB AFTER_MB`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

_ANON_MB = """
import re
from pathlib import Path

def anon_mb():
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"RssAnon:\\s+(\\d+)", status)[1]) / 1024
"""
"""Run ahead of each script: `anon_mb()`, its process's anonymous RSS in MB."""


def held_heap_mb(script: str, tmp_path: Path, *args: str) -> tuple[float, float]:
    """(before, after) in MB, as the script printed them; it runs with `tmp_path` and `args`."""
    done = subprocess.run(
        [sys.executable, "-c", _ANON_MB + script, str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r"HEAP ([\d.]+) ([\d.]+)", done.stdout)
    assert found, done.stdout[-2000:]
    return float(found[1]), float(found[2])
