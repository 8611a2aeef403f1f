"""`rlbus run` as a user runs it: every role a process, embedded broker and store, dashboard;
stops by itself at max_steps; `--resume` continues from the checkpoint (with a fresh embedded
broker: the store and the checkpoint are what survive), or says there is nothing to resume."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.pids import alive
from support.runs import rlbus_run, run_args

from rlbus.bus.store import Store, open_store
from rlbus.bus.waiting import wait_for
from rlbus.consumers.inference.model_init import init_model


@pytest.mark.slow
@pytest.mark.timeout(600)  # four `rlbus run`s, each allowed 120 s
def test_rlbus_run_stops_at_max_steps_and_resumes(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    init_model(model, seed=0)
    first = rlbus_run(tmp_path, model, "--max-steps", "2")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "finished at step 2" in first.stdout
    again = rlbus_run(tmp_path, model, "--max-steps", "2")
    assert again.returncode == 1 and "pass --resume" in again.stderr
    resumed = rlbus_run(tmp_path, model, "--max-steps", "3", "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    with open_store(f"chdb://{tmp_path / 'store'}", read_only=True) as store:
        steps = [
            r[0]
            for r in store.query(
                "SELECT step FROM train_steps FINAL WHERE run_id = 'cli' ORDER BY step"
            ).rows
        ]
    # (exit 0 also means the resumed inference served version 3: the orchestrator waits for it)
    assert steps == [1, 2, 3]
    nothing = rlbus_run(tmp_path, model, "--run-id", "other", "--resume")
    assert nothing.returncode == 1 and "nothing to resume" in nothing.stderr


@pytest.mark.slow
def test_roles_of_a_local_run_split_the_cores_between_inference_and_trainer() -> None:
    import os
    import subprocess

    from rlbus.launch.supervisor import role_threads, thread_env

    on_two = {r: role_threads(r, 1, 2) for r in ("inference", "trainer", "sink", "env", "judge")}
    assert on_two == {"inference": 1, "trainer": 1, "sink": 1, "env": 1, "judge": 1}
    assert (role_threads("inference", 4, 16), role_threads("trainer", 4, 16)) == (4, 12)
    assert role_threads("trainer", 2, 2) == 1
    # What a role's torch sees with that environment.
    child = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        env={**os.environ, **thread_env(1)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.stdout.strip() == "1", child.stderr


def loads_by_replica(store: Store, run: str) -> dict[str, list[tuple[int, float]]]:
    """Each replica's loads, (version, when), oldest version first."""
    rows = store.query(
        "SELECT url, version, min(ts) FROM weights_loaded FINAL WHERE run_id = {r:String} "
        "GROUP BY url, version ORDER BY url, version",
        {"r": run},
    ).rows
    loads: dict[str, list[tuple[int, float]]] = {}
    for url, version, at in rows:
        loads.setdefault(url, []).append((version, at.timestamp()))
    return loads


@pytest.mark.slow
def test_rlbus_run_spreads_rollouts_over_inference_replicas_and_records_each_version(
    tmp_path: Path,
) -> None:
    model = tmp_path / "tiny"
    init_model(model, seed=0)
    done = rlbus_run(
        tmp_path,
        model,
        "--max-steps",
        "3",
        "--inference.replicas",
        "2",
        "--envs.reverse_text.producers",
        "2",
        "--kafka.announce-every-s",
        "1",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open_store(f"chdb://{tmp_path / 'store'}", read_only=True) as store:
        served = dict(
            store.query(
                "SELECT replica, uniqExact(rollout_id) FROM tokens FINAL WHERE run_id = 'cli' "
                "GROUP BY replica"
            ).rows
        )
        calls = store.query(
            "SELECT replica, policy_version, toFloat64(ts), duration_s FROM tokens FINAL "
            "WHERE run_id = 'cli'"
        ).rows
        loads = loads_by_replica(store, "cli")
    # Both replicas sampled rollouts, and every call names the replica that answered it.
    assert len(served) == 2 and all(url and n > 0 for url, n in served.items()), served
    assert set(served) == set(loads), (served, loads)
    # Each call's version is the one its replica served when the call ran: loaded before the
    # call ended, and its next version (if any) loaded after the call began. (A replica
    # publishes a load once the new weights are in place; a second of slack covers the engine
    # taking them up at its next step.)
    slack = 1.0
    wrong = []
    for replica, version, ended, seconds in calls:
        history = loads[replica]
        loaded = [at for v, at in history if v == version]
        later = [at for v, at in history if v > version]
        if (
            not loaded
            or loaded[0] > ended + slack
            or (later and later[0] < ended - seconds - slack)
        ):
            wrong.append((replica, version, ended, seconds, history))
    assert calls and not wrong, wrong[:5]


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def start_run(tmp: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """`rlbus run` for many steps, returned mid-run (inference serves version 2): it and its
    role processes."""
    model = tmp / "tiny"
    init_model(model, seed=0)
    args = [*run_args(tmp, model), "--max-steps", "1000"]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp
    )
    logs = tmp / "store" / "runs" / "cli" / "logs"
    serving = logs / "inference.log"
    mid_run = lambda: serving.exists() and "serving weights version 2" in serving.read_text()  # noqa: E731
    wait_for(mid_run, 180, "inference to serve version 2")
    return proc, [c for c in children(proc.pid) if alive(c)]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_stopped_or_killed_rlbus_run_leaves_no_role_running(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGTERM (systemd, Kubernetes, a script's timeout) stops `rlbus run` as Ctrl-C does: the
    roles are stopped in order. SIGKILL gives it no chance: its roles (they die with it) and
    broker still go, instead of running on for good against a broker that is gone."""
    proc, roles = start_run(tmp_path)
    try:
        proc.send_signal(sig)
        out = proc.communicate(timeout=150)[0]
        if sig == signal.SIGTERM:
            assert proc.returncode == 130 and "continue with --resume" in out, out[-3000:]
        wait_for(lambda: not any(alive(r) for r in roles), 60, "the roles to stop")
    finally:
        proc.kill()
        for pid in roles:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
