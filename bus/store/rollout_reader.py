"""Stored rollouts read back whole, the one reader behind `rlbus export` and `rlbus replay sft`:
the rollouts a user's SQL condition selects, each with its chosen score, its messages and, when
asked, its trace nodes and token records.

The condition is the user's SQL. It only ever runs on a read-only store, where the guard
(bus.store.guard) passes the whole statement or refuses it, so it can read and never write.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rlbus.bus.store.client import Store, StoreError
from rlbus.schemas import RolloutCompleted, RolloutScored, TokenRecord, TraceNode

CHUNK = 500
"""Rollouts read per round trip: ids travel as one parameter, which a server endpoint takes in
its URL."""

SELECTION = """
SELECT event_id FROM scores_at(version = {{version:String}})
WHERE ({where}) AND status = 'ok'{scope}
ORDER BY task_id, sample_index, run_id, rollout_id
"""
"""The chosen score of each selected rollout that scored without error: each rollout's newest
score (version ''), or version V's alone."""


NO_TOKENS_HELP = (
    "they were sampled in eval mode against an endpoint that returns no token ids, so only their "
    "messages were stored. To get rollouts with tokens, sample in train mode (`rlbus eval ENV "
    "--mode train --tokenizer PATH`, or `rlbus run`), or evaluate against rlbus's own inference "
    "server (`rlbus worker inference`), which records token ids in any mode; `rlbus export` "
    "without --tokens writes these rollouts' messages as chat data"
)
"""Why selected rollouts hold no tokens, and how to get some."""


@dataclass
class StoredRollout:
    score: RolloutScored
    """The chosen score (the newest, or the chosen scorer version's)."""
    rollout: RolloutCompleted | None
    """None when its RolloutCompleted event is not in the store (a sink that missed it)."""
    nodes: list[TraceNode] = field(default_factory=list)
    records: list[TokenRecord] = field(default_factory=list)

    @property
    def has_tokens(self) -> bool:
        """Whether the model's token ids were recorded (eval mode against an outside endpoint
        stores token rows without ids)."""
        return any(r.completion_ids for r in self.records)


def selection_text(where: str, run_id: str | None) -> tuple[str, dict[str, Any]]:
    """The selecting statement and its parameters (the version parameter is added by the
    caller)."""
    scope, params = "", {}
    if run_id:
        scope, params = " AND run_id = {run:String}", {"run": run_id}
    return SELECTION.format(where=where.strip() or "1", scope=scope), params


def describe(where: str, run_id: str | None, version: str) -> str:
    """The selection in words, for messages."""
    scores = f"scorer version {version!r}" if version else "each rollout's newest score"
    return f"{where or 'every rollout'!r}{f' in run {run_id}' if run_id else ''} ({scores})"


def read_rollouts(
    store: Store,
    where: str,
    run_id: str | None = None,
    version: str = "",
    tokens: bool = False,
) -> Iterator[StoredRollout]:
    """The rollouts whose chosen score matches `where` (SQL over the columns of `scored`: run_id,
    env, task_id, reward, rewards, metrics, policy_version, ...), scored without error, in task
    and sample order; with their trace nodes and token records when `tokens`. `store` must be
    open read-only: `where` is the user's SQL."""
    if not store.read_only:
        raise StoreError(
            f"a user's selection runs only on a read-only store; open {store.url} with "
            "read_only=True"
        )
    sql, params = selection_text(where, run_id)
    ids = [row[0] for row in store.query(sql, {**params, "version": version}).rows]
    for start in range(0, len(ids), CHUNK):
        yield from _chunk(store, ids[start : start + CHUNK], tokens)


def _chunk(store: Store, score_ids: list[str], tokens: bool) -> Iterator[StoredRollout]:
    scores = store.read_events(
        RolloutScored, "event_id IN {ids:Array(String)}", parameters={"ids": score_ids}
    )
    by_event = {s.event_id: s for s in scores}
    rollout_ids = sorted({s.rollout_id for s in scores})
    params = {"ids": rollout_ids}
    where = "rollout_id IN {ids:Array(String)}"
    rollouts = {
        r.rollout_id: r for r in store.read_events(RolloutCompleted, where, parameters=params)
    }
    nodes: dict[str, list[TraceNode]] = defaultdict(list)
    records: dict[str, list[TokenRecord]] = defaultdict(list)
    if tokens:
        for n in store.read_events(TraceNode, where, parameters=params):
            nodes[n.rollout_id].append(n)
        for r in store.read_events(TokenRecord, where, parameters=params):
            records[r.rollout_id].append(r)
    for event_id in score_ids:
        score = by_event[event_id]
        yield StoredRollout(
            score,
            rollouts.get(score.rollout_id),
            nodes[score.rollout_id],
            records[score.rollout_id],
        )
