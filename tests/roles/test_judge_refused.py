"""Scores of a group that never completed, when the broker does not take them (a request that
timed out): the judge scores such a group as errors after its environment's group_wait_s, from
its handler or from its own look every few seconds. Neither look is the handler's input, so the
subscriber's retry of the handler does not cover them; against a real broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.broker_refusals import RefusingBus, handled, published
from support.factories import completed_rollout

from rlbus.bus import Bus, Delivery
from rlbus.bus.commits import Holds
from rlbus.config import Settings
from rlbus.consumers.judge.judging import Judge
from rlbus.environment import load_environment
from rlbus.schemas import RolloutScored

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"
WAIT_S = 0.2


def arrived(group: str, size: int, holds: Holds, *indices: int, offset: int = 0) -> list[Delivery]:
    """Rollouts `indices` of a group of `size`, as the judge's subscriber delivers them."""
    return [
        Delivery(completed_rollout(i, group, size), "rollouts", 0, offset + n, holds=holds)
        for n, i in enumerate(indices)
    ]


def scores(events: list) -> list[tuple[str, str]]:
    return sorted((e.rollout_id, e.status) for e in events if isinstance(e, RolloutScored))


async def test_a_look_whose_scores_the_broker_refused_sends_them_at_the_next(
    settings: Settings,
) -> None:
    """Before: the refused publish ended the judge's looking task, so the group's error scores
    never went out and its rollouts stayed held (uncommitted) for good."""
    env = load_environment(str(EXAMPLE), {"group_wait_s": WAIT_S})
    holds = Holds()
    stop = asyncio.Event()
    async with Bus.of(settings) as real:
        judge = Judge([env], RefusingBus(real, refusals=1))  # type: ignore[arg-type]
        await judge.handle(arrived("orphan", 4, holds, 0, 1))
        looking = asyncio.create_task(judge.keep_expiring(stop, every_s=WAIT_S))
        for _ in range(40):
            if judge.scored or looking.done():
                break
            await asyncio.sleep(0.25)
        stop.set()
        await looking
        stored = await published(real, "scored", settings.run_id, 2)
    assert scores(stored) == [("orphan-0", "error"), ("orphan-1", "error")]
    assert judge.incomplete == 1 and holds.offsets("rollouts", 0) == []


async def test_a_handler_whose_look_was_refused_scores_its_own_groups_once(
    settings: Settings,
) -> None:
    """A call scores a group that completed, then looks, and the broker refuses the expired
    group's scores. Before: the handler failed, and its retry took the completed group's
    rollouts in again as a new group (which would expire as errors) while the expired group's
    scores were never sent."""
    env = load_environment(str(EXAMPLE), {"group_wait_s": WAIT_S})
    holds = Holds()
    async with Bus.of(settings) as real:
        # The whole group's scores are taken, the expired group's refused.
        judge = Judge([env], RefusingBus(real, refusals=1, after=1))  # type: ignore[arg-type]
        await judge.handle(arrived("orphan", 4, holds, 0, 1))
        await asyncio.sleep(2 * WAIT_S)
        await handled(judge.handle, arrived("whole", 2, holds, 0, 1, offset=2))
        await judge.expire()
        stored = await published(real, "scored", settings.run_id, 4)
    assert scores(stored) == [
        ("orphan-0", "error"),
        ("orphan-1", "error"),
        ("whole-0", "ok"),
        ("whole-1", "ok"),
    ]
    assert judge.pending == {} and holds.offsets("rollouts", 0) == []
