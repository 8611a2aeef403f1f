"""What "every score has landed" means to the commands that then read scores with their
rollouts (`rlbus eval`'s report, the quickstart's held-out rewards): a score whose rollout is
not stored yet is not landed. The two are on different topics, fetched apart, and a rollout's
score can reach the store first."""

from __future__ import annotations

import asyncio

from support.factories import make_event

from rlbus.bus import Bus
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings
from rlbus.launch.eval import SCORED
from rlbus.launch.local_sink import local_sink
from rlbus.launch.recipe import SCORED_SQL
from rlbus.schemas import Event, RolloutCompleted, RolloutScored


async def publish(settings: Settings, events: list[Event]) -> None:
    async with Bus.of(settings) as bus:
        await bus.publish_many(events)


def test_a_score_is_landed_only_once_its_rollout_is_stored(settings: Settings) -> None:
    run = settings.run_id
    scopes = [(SCORED, {"run": run, "env": "reverse_text"}), (SCORED_SQL, {"run": run})]
    plain = "SELECT count() FROM scored FINAL WHERE run_id = {run:String}"
    with local_sink(settings) as sink:
        asyncio.run(publish(settings, [make_event(RolloutScored, 0, run)]))
        wait_for(lambda: sink.count(plain, {"run": run}) == 1, 60, "the score in the store")
        assert [sink.count(sql, scope) for sql, scope in scopes] == [0, 0]

        asyncio.run(publish(settings, [make_event(RolloutCompleted, 0, run)]))
        wait_for(
            lambda: [sink.count(sql, scope) for sql, scope in scopes] == [1, 1],
            60,
            "the score counted as landed once its rollout is stored",
        )
