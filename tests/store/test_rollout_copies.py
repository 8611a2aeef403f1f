"""A rollout stored with two contents counts once in every figure a user reads.

A task rolled out again under the same rollout ids (its producer killed after publishing and
before committing; until 2b47e85, also a publish the broker timed out:
tests/history/test_broker_stall.py) leaves a second content beside the first, and the store
keeps both (the conflicts view). CI at 367be5d showed the compare page listing both copies; the
figures below (the runs page, a run's page, the quickstart, the eval summary, the recipe's
figures, the error and latency views) counted them twice."""

from __future__ import annotations

import msgspec
import pytest
from support.stored_runs import run_events, store_events

from rlbus.bus.store import open_store
from rlbus.bus.store.reads import eval_summary, quickstart, recipe, run_page, ui
from rlbus.bus.store.rollout_reader import read_rollouts
from rlbus.schemas import RolloutCompleted, RolloutScored, TokenRecord, derived_id

READERS = {
    "runs page": f"SELECT rollouts, errors FROM ({ui.RUNS_ROLLOUTS}) WHERE run_id = {{run:String}}",
    "run page": f"SELECT rollouts, errors FROM ({run_page.RUN_SUMMARY})",
    "quickstart": quickstart.COUNTS["rollouts"],
    "eval tokens": eval_summary.TOKENS,
    "eval errors": eval_summary.ERRORS,
    "held-out figures": recipe.HELD_OUT_SQL,
    "reward curve": f"SELECT * EXCEPT first_ts FROM ({recipe.TRAIN_REWARD_SQL})",
    "errors view": (
        "SELECT stage, kind, errors FROM errors_by_kind WHERE run_id = {run:String} "
        "ORDER BY stage, kind"
    ),
    "latency view": "SELECT rollouts, model_calls FROM latency WHERE run_id = {run:String}",
}


def errored(run: str) -> list[list]:
    """A rollout whose harness failed, and its score."""
    common = {
        "run_id": run,
        "rollout_id": derived_id(run, "errored"),
        "group_id": derived_id(run, "errored-group"),
        "task_id": "t-errored",
        "env": "reverse_text",
        "group_size": 1,
    }
    return [
        [RolloutCompleted(**common, status="error", error="timed out", error_kind="timeout")],
        [RolloutScored(**common, status="error", error="the rollout failed")],
    ]


def copies(batches: list[list]) -> list[list]:
    """A second content of three rollouts (a training one, a held-out one, the errored one)
    and of their model calls' token records, as a second attempt makes them: the same ids, a
    later time, other durations."""
    events = [e for batch in batches for e in batch]
    rollouts = [e for e in events if isinstance(e, RolloutCompleted)]
    chosen = {r.rollout_id for r in (rollouts[0], rollouts[3], rollouts[-1])}
    return [
        [
            msgspec.structs.replace(e, ts=e.ts + 60, duration_s=e.duration_s + 0.25)
            for e in events
            if isinstance(e, kind) and e.rollout_id in chosen
        ]
        for kind in (RolloutCompleted, TokenRecord)
    ]


def run(run_id: str) -> list[list]:
    """A stored run (support.stored_runs) with its training rollouts marked as such (the reward
    curve reads them) and an errored rollout."""
    batches = [*run_events(run_id, train=True), *errored(run_id)]
    for event in (e for batch in batches for e in batch):
        if isinstance(event, RolloutCompleted):
            event.info = event.info or {"split": "train"}
            event.prompt_tokens, event.completion_tokens = 5, 3
    return batches


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two runs alike, but for the second contents of three of the second one's rollouts."""
    url = f"chdb://{tmp_path_factory.mktemp('copies') / 'store'}"
    copied = run("copied")
    store_events(url, [*run("plain"), *copied, *copies(copied)])
    return url


def test_a_rollout_stored_twice_with_other_content_counts_once(store_url: str) -> None:
    with open_store(store_url, read_only=True) as store:
        conflicts = store.query(
            "SELECT table, run_id, count() FROM conflicts GROUP BY ALL ORDER BY ALL"
        ).rows
        assert conflicts == [("rollouts", "copied", 3), ("tokens", "copied", 2)]  # both kept

        def read(query: str, run: str) -> list[tuple]:
            return store.query(query, {"run": run, "env": "reverse_text", "version": ""}).rows

        figures = {name: read(q, "plain") for name, q in READERS.items()}
        assert all(figures.values()), figures  # each reader has something to count
        assert {name: read(q, "copied") for name, q in READERS.items()} == figures


def test_a_rollout_stored_twice_reads_back_as_its_newest_copy(store_url: str) -> None:
    """What export, SFT replay, rescoring and a rollout's page read (Store.read_events): one
    event per id, the newest; on main both copies came back, and a replayed rollout carried
    its model calls twice."""
    with open_store(store_url, read_only=True) as store:
        params = {"run": "copied"}
        for kind in (RolloutCompleted, TokenRecord):
            events = store.read_events(kind, "run_id = {run:String}", parameters=params)
            ids = [e.event_id for e in events]
            assert len(ids) == len(set(ids)) == (13 if kind is RolloutCompleted else 12)
            assert (
                sorted(e.duration_s for e in events).count(
                    0.75 if kind is RolloutCompleted else 0.5
                )
                == 2
            )
        stored = list(read_rollouts(store, "1", run_id="copied", tokens=True))
    assert len(stored) == 12  # the errored rollout is not selected
    assert all(len(s.records) == 1 for s in stored)
    newest = [s for s in stored if s.rollout is not None and s.rollout.duration_s == 0.75]
    assert len(newest) == 2 and all(s.records[0].duration_s == 0.5 for s in newest)
