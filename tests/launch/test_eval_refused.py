"""`rlbus eval` publishes each group's events itself (no consumer, so no handler run again):
a publish the broker did not take (a request that timed out) is made again, with the same
events, against a real broker."""

from __future__ import annotations

from pathlib import Path

from support import ScriptedServer
from support.broker_refusals import RefusingBus, published

from rlbus.bus import Bus
from rlbus.config import Settings
from rlbus.config.env import cli_overrides
from rlbus.environment import load_environment
from rlbus.launch.eval_pipeline import EvalPipeline
from rlbus.producers.interception import InterceptionServer
from rlbus.producers.rollouts import RolloutRunner
from rlbus.schemas import RolloutScored

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"


async def test_a_group_whose_publish_the_broker_refused_is_published_again(
    settings: Settings,
) -> None:
    """Before: the eval failed on the first refusal (`rlbus eval` exited with the KafkaError)."""
    run = settings.run_id
    with ScriptedServer() as upstream:
        env = load_environment(str(EXAMPLE), cli_overrides("s", f"{upstream.url}/v1", 2, None))
        tasks = list(env.eval_tasks(run).take(3))
        for task in tasks:
            task.run_id = run
        async with Bus.of(settings) as real, InterceptionServer.of(env.config) as server:
            bus = RefusingBus(real, refusals=1)
            pipeline = EvalPipeline(RolloutRunner(env, server), bus)  # type: ignore[arg-type]
            tally = await pipeline.run(tasks)
            scored = await published(real, "scored", run, 6)
    assert tally.rollouts == 6 and bus.refusals == 0
    assert len({e.rollout_id for e in scored if isinstance(e, RolloutScored)}) == 6
