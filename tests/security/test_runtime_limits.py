"""Finding 3: the subprocess runtime was no boundary. A program read the parent's secrets from
/proc/$PPID/environ, outlived its time limit with `setsid`, and used 842 MiB under a 300 MiB
limit (the limit was per process). Each attack runs under `subprocess` and under the default
runtime for `command` harnesses (`sandbox` where bubblewrap works)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from security_agents import kill_all, processes_with, report, run_agent
from support import ScriptedServer

RUNTIMES = [pytest.param({"kind": "subprocess"}, id="subprocess"), pytest.param({}, id="default")]

READ_SECRETS = """
secret = os.environ["LOOK_FOR"].encode()
found_in = []
for pid in [os.getppid(), *(int(p) for p in os.listdir("/proc") if p.isdigit())]:
    try:
        if pid != os.getpid() and secret in open(f"/proc/{pid}/environ", "rb").read():
            found_in.append(pid)
    except OSError:
        pass
print(json.dumps({"found_in": sorted(set(found_in)), "mine": sorted(os.environ)}))
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.slow
def test_the_program_cannot_read_the_parents_secrets(
    tmp_path: Path, upstream: ScriptedServer, runtime: dict
) -> None:
    """The producer (a process of its own, so /proc/PID/environ shows its secret) runs a program
    that looks for the secret in every environment it can read."""
    secret = f"hunter2-{uuid.uuid4().hex}"
    spec = {
        "tmp_path": str(tmp_path),
        "upstream": upstream.url,
        "program": READ_SECRETS,
        "runtime": runtime,
        # The program gets the secret's tail to look for; it carries no name a search would hit.
        "harness": {"env": {"LOOK_FOR": secret[-24:]}},
    }
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("security_agents.py")), json.dumps(spec)],
        env={**os.environ, "RLBUS_TEST_STORE_PASSWORD": secret},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (seen,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["found_in"] == [] and "RLBUS_TEST_STORE_PASSWORD" not in seen["mine"], seen


SETSID = """
import subprocess
marker = os.environ["MARKER"]
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(3600)", marker], start_new_session=True,
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(json.dumps({"pid": child.pid}), flush=True)
if os.environ["MODE"] == "outlive":
    time.sleep(3600)
"""
"""Program and child sleep far past the test's own limits: a runtime that waited for either to
end by itself would fail the test (a timeout) instead of passing late."""


@pytest.mark.parametrize("mode", ["outlive", "exit"])
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.slow
async def test_a_setsid_child_dies_with_its_program(
    tmp_path: Path, upstream: ScriptedServer, runtime: dict, mode: str
) -> None:
    """`outlive`: the program runs past its limit; `exit`: it exits at once, leaving a daemon.
    Either way the rollout ends (the limit below only keeps a runtime that waits for them from
    hanging the test) and nothing of the program is left."""
    marker = f"rlbus-setsid-{uuid.uuid4().hex}"
    try:
        (out,) = await asyncio.wait_for(
            run_agent(
                tmp_path,
                upstream.url,
                SETSID,
                runtime={**runtime, "timeout_s": 2},
                harness={"env": {"MARKER": marker, "MODE": mode}},
            ),
            120,
        )
        assert out.rollout.error_kind == ("timeout" if mode == "outlive" else ""), out.rollout.error
        child = report(out)["pid"]
        time.sleep(0.3)
        # By PID where the program shares our PID namespace; by its marker everywhere.
        if runtime.get("kind") == "subprocess":
            assert child not in processes_with(marker)
        assert processes_with(marker) == []
    finally:
        kill_all(processes_with(marker))


TREE = """
import subprocess
import time
hold = "x = bytearray(100 << 20); print('held', flush=True); import time; time.sleep(4)"
children = [subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
            for _ in range(4)]
said = [child.stdout.readline().strip() == "held" for child in children]
# Holding now: said so and still alive (the kernel may have killed one after it said so). The
# pause lets a kill under way finish: a child the OOM killer has chosen but not yet reaped reads
# as alive (seen on a loaded machine as 300 MiB "held" under the 250 MiB limit).
time.sleep(1)
held = sum(s and child.poll() is None for s, child in zip(said, children))
print(json.dumps({"held_mib": 100 * held}), flush=True)
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.slow
async def test_memory_is_bounded_for_the_whole_process_tree(
    tmp_path: Path, upstream: ScriptedServer, runtime: dict
) -> None:
    """Four children of 100 MiB each under a 250 MiB limit: at most two may hold theirs."""
    (out,) = await run_agent(
        tmp_path, upstream.url, TREE, runtime={**runtime, "memory_mb": 250, "timeout_s": 30}
    )
    rollout = out.rollout
    if rollout.error_kind:
        # The watchdog (no writable cgroup) kills the whole tree when it goes over.
        assert rollout.error_kind == "memory" and "250 MiB" in rollout.error, rollout.error
    else:
        assert report(out)["held_mib"] <= 200, report(out)
