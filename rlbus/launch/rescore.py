"""`rlbus rescore` as a library call: score a run's stored rollouts again with an environment's
current rules, without regenerating them, and publish the scores under a scorer version.

Rollouts are read through the store's read-only path: the run and environment as parameters,
the user's condition as the WHERE clause of one statement the read-only guard checks (its
parentheses balanced, so it cannot end the clause early). Group rewards see each stored group
whole, while scores are published for the selected rollouts only. A rollout already scored by
this version is skipped, so a repeat publishes nothing and an interrupted rescore resumes; the
scores' ids come from the rollout and the version, so the store keeps one of each. Then it
waits until the scores are in the store and reads back their summary (read_eval_summary).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from rich.progress import TextColumn

from rlbus.bus import Bus
from rlbus.bus.store import Store, open_store
from rlbus.bus.store.reads.rescore import GROUP_MEMBERS, RESCORED, STORED, VERSION_SCORES
from rlbus.bus.store.sqltext import SqlTextError, Tok, sql_tokens
from rlbus.config import Settings
from rlbus.console import progress
from rlbus.discovery import local_broker
from rlbus.environment import Environment, Scorer
from rlbus.launch.collector import steady_collector
from rlbus.launch.eval_pipeline import Tally
from rlbus.launch.eval_summary import EvalSummary, read_eval_summary
from rlbus.launch.local_sink import local_sink
from rlbus.schemas import RolloutCompleted

GROUPS_AT_ONCE = 64
"""Groups scored concurrently (an LLM judge bounds its own calls further)."""


class RescoreError(RuntimeError):
    """A rescore that cannot start or finish; the message says what to do."""


@dataclass
class RescoreResult:
    run_id: str
    version: str
    selected: int
    """Rollouts of the run and environment the condition matched."""
    skipped: int
    """Of those, already scored by this version."""
    tally: Tally
    """What this invocation scored."""
    report: EvalSummary
    """The version's scores of the run, as the store holds them now."""
    seconds: float


def checked_where(where: str) -> str:
    """`where` as a condition that stays inside its parentheses: balanced, one statement."""
    depth = 0
    try:
        for kind, start, end in sql_tokens(where):
            text = where[start:end]
            if kind is Tok.SEMICOLON:
                raise RescoreError(f"--where is one condition; it has a ';' at position {start}")
            depth += (text == "(") - (text == ")")
            if depth < 0:
                raise RescoreError(
                    f"--where closes a parenthesis it never opened (position {start})"
                )
    except SqlTextError as exc:
        raise RescoreError(f"--where cannot be read: {exc}") from None
    if depth:
        raise RescoreError(f"--where leaves {depth} parenthesis(es) open")
    return where


def stored_rollouts(
    store: Store, run_id: str, env_id: str, where: str = ""
) -> list[RolloutCompleted]:
    """The run's rollouts of the environment that match `where` (SQL over `rollouts`)."""
    condition = STORED
    if where.strip():
        condition += f" AND ({checked_where(where)})"
    try:
        found = store.read_events(
            RolloutCompleted, condition, parameters={"run": run_id, "env": env_id}
        )
    except Exception as exc:  # the engine's own words (unknown column, syntax) say most
        if not where.strip():
            raise
        raise RescoreError(f"cannot select rollouts --where {where!r}: {exc}") from exc
    return found


def _groups(
    store: Store, scorer: Scorer, run_id: str, chosen: list[RolloutCompleted]
) -> list[list[RolloutCompleted]]:
    """The groups to score: with group rewards each stored group whole, else what was chosen."""
    if not scorer.needs_group:
        members = chosen
    else:
        members = store.read_events(
            RolloutCompleted,
            GROUP_MEMBERS,
            parameters={"run": run_id, "groups": sorted({r.group_id for r in chosen})},
        )
    groups: dict[str, list[RolloutCompleted]] = defaultdict(list)
    for rollout in members:  # one per rollout: read_events gives one event per id
        groups[rollout.group_id].append(rollout)
    return list(groups.values())


async def _publish(
    settings: Settings,
    scorer: Scorer,
    groups: list[list[RolloutCompleted]],
    chosen: set[str],
    on_group: Callable[[Tally], None],
) -> Tally:
    tally = Tally()
    slots = asyncio.Semaphore(GROUPS_AT_ONCE)
    async with Bus.of(settings) as bus:

        async def one(group: list[RolloutCompleted]) -> None:
            async with slots:
                scoring = await scorer.scoring(group, only=chosen)
                await bus.publish_many(scoring.events())
            tally.add(scoring.scored)
            on_group(tally)

        try:
            await asyncio.gather(*(one(g) for g in groups))
        finally:
            await scorer.aclose()
    return tally


def rescore(
    env: Environment,
    settings: Settings,
    *,
    run_id: str,
    where: str = "",
    version: str | None = None,
    store_timeout_s: float = 300,
    show_progress: bool = True,
) -> RescoreResult:
    """Score `run_id`'s stored rollouts of `env` (those matching `where`) with the environment's
    rules as they are now, as scorer `version` (default: the rules' digest)."""
    try:
        scorer = Scorer(env, version)
    except ValueError as exc:
        raise RescoreError(str(exc)) from None
    scope = {"run": run_id, "env": env.id, "version": scorer.version}
    with local_broker(settings) as (live, _), local_sink(live) as sink:
        live = live.model_copy(update={"run_id": run_id})
        with open_store(live.store.url, read_only=True) as store:
            selected = stored_rollouts(store, run_id, env.id, where)
            if not selected:
                raise RescoreError(
                    f"no stored rollouts of {env.id} in run {run_id!r}"
                    + (f" match {where!r}" if where.strip() else "")
                    + f" ({live.store.url})"
                )
            done = {str(row[0]) for row in store.query(RESCORED, scope).rows}
            chosen = [r for r in selected if r.rollout_id not in done]
            groups = _groups(store, scorer, run_id, chosen) if chosen else []
        before = sink.count(VERSION_SCORES, scope)
        fields = (
            TextColumn("errors {task.fields[errors]}"),
            TextColumn("reward {task.fields[reward]:.3f}"),
        )
        started = time.monotonic()
        with progress(*fields, disable=not show_progress) as bars:
            bar = bars.add_task(
                f"{env.id} ({run_id}) as {scorer.version}", total=len(chosen), errors=0, reward=0.0
            )

            def on_group(tally: Tally) -> None:
                bars.update(
                    bar, completed=tally.rollouts, errors=tally.errors, reward=tally.mean_reward
                )

            ids = {r.rollout_id for r in chosen}
            with steady_collector():
                tally = asyncio.run(_publish(live, scorer, groups, ids, on_group))
            landed = bars.add_task(
                "in ClickHouse", total=before + tally.rollouts, errors="", reward=0.0
            )
            sink.wait_landed(
                VERSION_SCORES,
                scope,
                before + tally.rollouts,
                f"{tally.rollouts} scores of run {run_id} by {scorer.version} in the store",
                store_timeout_s,
                on_count=lambda count: bars.update(landed, completed=count),
            )
        seconds = time.monotonic() - started
        with open_store(live.store.url, read_only=True) as store:
            report = read_eval_summary(store, run_id, env.id, version=scorer.version)
    return RescoreResult(
        run_id, scorer.version, len(selected), len(selected) - len(chosen), tally, report, seconds
    )
