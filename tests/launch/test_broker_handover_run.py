"""`rlbus run` hands its embedded broker over to a fresh one when it holds more than
kafka.embedded_max_rss_mb (here: 1 MB, so as often as kafka.embedded_handover_every_s allows):
every role stops, what is unfinished moves to the new broker, every role resumes on it. Counted
with SQL afterwards: every step trained once, no conflicting history, no dead letter."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.runs import rlbus_run

from rlbus.bus.store import open_store
from rlbus.consumers.inference.model_init import init_model

STEPS = 10
HANDED_OVER = re.compile(
    r"broker handed over: ([\d,]+) unfinished messages carried .*?, ([\d,]+) left behind, "
    r"(\d+)\s+consumer groups moved",
    re.S,
)


@pytest.mark.slow
@pytest.mark.timeout(900)  # each handover restarts every role: ~60 s apiece under CI's load
def test_a_run_whose_broker_is_handed_over_mid_run_trains_every_step_once(
    tmp_path: Path,
) -> None:
    model = tmp_path / "tiny"
    init_model(model, seed=0)
    done = rlbus_run(
        tmp_path,
        model,
        "--max-steps",
        str(STEPS),
        "--kafka.embedded-max-rss-mb",
        "1",
        "--kafka.embedded-handover-every-s",
        "3",
        timeout_s=840,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    handovers = [
        tuple(int(n.replace(",", "")) for n in m.groups()) for m in HANDED_OVER.finditer(out)
    ]
    # Mid-run: every role's group was on the broker, and it held work not yet done.
    assert any(carried > 0 and groups >= 5 for carried, _, groups in handovers), out[-3000:]
    with open_store(f"chdb://{tmp_path / 'store'}", read_only=True) as store:

        def one(sql: str) -> int:
            return int(store.query(sql).rows[0][0])

        steps = store.query(
            "SELECT step, count() FROM train_steps FINAL WHERE run_id = 'cli' GROUP BY step "
            "ORDER BY step"
        ).rows
        assert [tuple(r) for r in steps] == [(s, 1) for s in range(1, STEPS + 1)]
        assert one("SELECT count() FROM batches FINAL WHERE run_id = 'cli'") == STEPS
        conflicts = store.query(
            "SELECT `table`, count(), any(event_id), any(origins) FROM conflicts GROUP BY `table`"
        ).rows
        assert conflicts == [], conflicts
        assert one("SELECT count() FROM dead_letters") == 0
