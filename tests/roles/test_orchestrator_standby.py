"""A second orchestrator of a run waits as a standby and takes over when the leader is
SIGKILLed: `rlbus run`'s roles as processes on the real broker and a chdb store, the leader
found by its log and killed by PID, then every step's batches counted with SQL. How long the
run stands still meanwhile is measured by `python bench/faults.py --replicas 2` (stalled_s),
not asserted here."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlbus.bus.store import open_store
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings
from rlbus.config.runs import load_run_config
from rlbus.console import console
from rlbus.consumers.inference.model_init import init_model
from rlbus.discovery import local_broker, store_served_elsewhere
from rlbus.launch.processes import RoleProcess
from rlbus.launch.supervisor import LocalRun

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"
LEADS = "leading run"


def rows(settings: Settings, sql: str) -> list[tuple]:
    """A read-only query through the sink's endpoint (the run holds the chdb directory)."""
    wait_for(lambda: store_served_elsewhere(settings), 60, "the sink to serve the store")
    with open_store(settings.store.url, read_only=True) as store:
        return store.query(sql).rows


def leader(orchestrators: list[RoleProcess]) -> RoleProcess | None:
    leading = [o for o in orchestrators if o.alive() and LEADS in o.log_path.read_text()]
    return leading[0] if len(leading) == 1 else None


@pytest.mark.slow
def test_a_standby_orchestrator_takes_over_with_one_batch_per_step(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    init_model(model, seed=0)
    steps = 5
    overrides = [
        "--run-id", "standby",
        "--model", str(model),
        "--max-steps", str(steps),
        "--store.url", f"chdb://{tmp_path / 'store'}",
        "--claim-check.url", str(tmp_path / "claims"),
        "--trainer.checkpoint-url", str(tmp_path / "checkpoints"),
        "--orchestrator.tasks-per-step", "2",
        "--orchestrator.eval-every", "0",
        "--orchestrator.standbys", "1",
        "--envs.reverse_text.overrides.group-size", "4",
        "--kafka.announce-every-s", "1",
    ]  # fmt: skip
    cfg = load_run_config(EXAMPLE / "rl.toml", overrides)
    run = LocalRun(cfg, EXAMPLE / "rl.toml", overrides, resume=False, console=console)
    with local_broker(cfg.base()) as (base, _):
        try:
            roles = run.start_roles(base)
            first, standby = roles.orchestrators

            def batches() -> int:
                sql = "SELECT count() FROM batches FINAL WHERE run_id = 'standby'"
                return rows(base, sql)[0][0]

            wait_for(lambda: batches() >= 2, 600, "two batches")
            active = leader(roles.orchestrators)
            assert active is not None, [o.log_path.read_text()[-2000:] for o in (first, standby)]
            other = standby if active is first else first
            assert LEADS not in other.log_path.read_text()  # it waited
            active.kill()  # SIGKILL: no chance to leave the group or commit
            wait_for(lambda: LEADS in other.log_path.read_text(), 120, "the standby to lead")
            assert other.proc.wait(600) == 0, other.log_tail()  # it finished the run
            # The sink may still be inserting the last batch; one never published never lands.
            wait_for(lambda: batches() >= steps, 120, f"{steps} batches in the store")
            per_step = rows(
                base,
                "SELECT step, count(), uniqExact(digest) FROM batches FINAL "
                "WHERE run_id = 'standby' GROUP BY step ORDER BY step",
            )
            conflicts = rows(base, "SELECT count() FROM conflicts WHERE run_id = 'standby'")
        finally:
            run.stop()
    assert [s for s, _, _ in per_step] == list(range(1, steps + 1)), per_step  # no gap
    assert all(n == 1 and digests == 1 for _, n, digests in per_step), per_step  # one each
    assert conflicts == [(0,)]
