"""`rlbus run` as a user runs it: every role a process, embedded broker and store, dashboard;
stops by itself at max_steps; `--resume` continues from the checkpoint (with a fresh embedded
broker: the store and the checkpoint are what survive), or says there is nothing to resume."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlbus.bus.store import Store, open_store
from rlbus.consumers.inference.model_init import init_model

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "reverse_text"


def rlbus_run(tmp: Path, model: Path, *extra: str) -> subprocess.CompletedProcess:
    args = [
        sys.executable,
        "-m",
        "rlbus",
        "run",
        str(EXAMPLE / "rl.toml"),
        "--model",
        str(model),
        "--run-id",
        "cli",
        "--store.url",
        f"chdb://{tmp / 'store'}",
        "--claim-check.url",
        str(tmp / "claims"),
        "--orchestrator.tasks-per-step",
        "4",
        "--orchestrator.eval-every",
        "0",
        "--envs.reverse_text.overrides.group-size",
        "4",
        *extra,
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=240, cwd=tmp, check=False)


@pytest.mark.slow
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
    import sys

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
