"""The orchestrator's parts, each alone and without a broker: the pacing policy each mode picks,
the staleness gate, the held deliveries of rollouts not yet batched and the held-out schedule."""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator

from rlbus.bus import Delivery
from rlbus.bus.commits import Holds
from rlbus.config.orchestrator import OrchestratorConfig
from rlbus.consumers.orchestrator.held_out import HeldOut, HeldOutEval
from rlbus.consumers.orchestrator.holds import HeldRollouts
from rlbus.consumers.orchestrator.join import Group
from rlbus.consumers.orchestrator.pacing import (
    AsyncPacing,
    Pacer,
    Progress,
    SyncPacing,
    pacing_for,
)
from rlbus.consumers.orchestrator.staleness_gate import ReadyGroup, StalenessGate
from rlbus.consumers.orchestrator.task_draw import EVAL_VERSION, SPLIT, TaskSource
from rlbus.environment.algorithm import GroupMember
from rlbus.schemas import RolloutCompleted, RolloutScored, TrainBatch, TrainSample


def at(step: int = 0, ready: int = 0, inflight: int = 0, served: int = 0, start: int = 0):
    return Progress(step, ready, inflight, served, start)


def test_each_mode_picks_its_pacing() -> None:
    assert isinstance(pacing_for(OrchestratorConfig(mode="async"), 10), AsyncPacing)
    assert isinstance(pacing_for(OrchestratorConfig(mode="sync"), 10), SyncPacing)


def test_async_batches_whenever_a_step_of_groups_is_ready_and_publishes_what_the_pacer_allows():
    pacer = Pacer(tasks_per_step=4, max_off_policy_steps=2)
    pacing = AsyncPacing(pacer, tasks_per_step=4, max_steps=3)
    assert pacing.may_batch(at(ready=3)) is None
    assert pacing.may_batch(at(ready=9)) == 4
    assert pacing.may_batch(at(step=3, ready=9)) is None  # max_steps batches are out
    assert pacing.tasks_to_publish(at()) == 8 == pacer.room(0, 3, 0, 0, 0)
    # Resumed at version 2: nothing goes out before inference serves the trainer's weights.
    assert pacing.tasks_to_publish(at(step=2, served=1, start=2)) == 0
    assert pacing.tasks_to_publish(at(step=2, served=2, start=2)) == 8


def test_sync_runs_a_round_batches_it_once_all_is_back_then_waits_for_the_new_weights() -> None:
    pacing = SyncPacing(Pacer(4, 2), tasks_per_step=4, max_steps=2)
    assert pacing.may_batch(at()) is None
    assert pacing.tasks_to_publish(at()) == 4  # inference serves version 0: step 1's tasks
    assert pacing.tasks_to_publish(at(inflight=4)) == 0  # one round at a time
    assert pacing.may_batch(at(ready=3, inflight=1)) is None  # a group is still out
    assert pacing.may_batch(at(ready=4)) == 4  # every group is back (some may be dropped)
    pacing.batched(True)
    assert pacing.may_batch(at(step=1)) is None
    assert pacing.tasks_to_publish(at(step=1, served=0)) == 0  # waits for version 1
    assert pacing.tasks_to_publish(at(step=1, served=1)) == 4
    # Every group came back dropped: nothing to train on, so no batch but another round of
    # tasks for the same step, once.
    assert pacing.may_batch(at(step=1)) == 0
    pacing.batched(False)
    assert pacing.may_batch(at(step=1)) is None
    assert pacing.tasks_to_publish(at(step=1, served=1)) == 4
    assert pacing.tasks_to_publish(at(step=1, inflight=4, served=1)) == 0
    assert pacing.may_batch(at(step=1, ready=2)) == 2
    pacing.batched(True)
    assert pacing.may_batch(at(step=2, ready=5)) is None
    assert pacing.tasks_to_publish(at(step=2, served=2)) == 0  # the run's batches are out


def sample(rollout_id: str, version: int) -> TrainSample:
    return TrainSample(
        rollout_id=rollout_id,
        input_ids=b"",
        loss_mask=b"",
        advantages=b"",
        inference_logprobs=b"",
        policy_version=version,
    )


def test_the_gate_keeps_samples_within_max_off_policy_steps_and_counts_the_rest() -> None:
    groups = [
        ReadyGroup([sample("a", 2), sample("b", 5)], [0.0, 1.0], ["a", "b"]),
        ReadyGroup([sample("c", 4)], [1.0], ["c"]),
    ]
    fresh = StalenessGate(max_off_policy_steps=2).fresh(groups, version=6)
    assert [s.rollout_id for s in fresh.kept] == ["b", "c"]
    assert fresh.dropped == 1 and fresh.histogram == {"1": 1, "2": 1, "4": 1}
    assert StalenessGate(max_off_policy_steps=4).fresh(groups, version=6).dropped == 0


def delivery(rollout_id: str, offset: int, holds: Holds, topic: str = "scored") -> Delivery:
    event = RolloutScored(rollout_id=rollout_id, group_id="g", task_id="t", env="e")
    headers = ((f"h{offset}", b""),)
    return Delivery(event, topic, 0, offset, headers=headers, holds=holds)


def test_pieces_stay_uncommitted_until_their_rollout_is_batched_or_released() -> None:
    commits = Holds()
    held = HeldRollouts(max_off_policy_steps=2)
    assert held.hold("r1", delivery("r1", 0, commits, topic="tokens"))
    assert held.hold("r1", delivery("r1", 1, commits))
    assert held.hold("r2", delivery("r2", 2, commits))
    assert commits.oldest("scored", 0) == 1 and commits.oldest("tokens", 0) == 0
    assert held.headers(["r1", "r2"], "scored") == [(("h1", b""),), (("h2", b""),)]
    held.mark_batched(["r1"], step=1)
    assert list(held.held) == ["r2"] and commits.oldest("tokens", 0) is None
    assert not held.hold("r1", delivery("r1", 3, commits))  # redelivered after a restart
    assert commits.oldest("scored", 0) == 2
    held.release(["r2"])
    assert not held.held and commits.oldest("scored", 0) is None


async def read_back(*batches: TrainBatch) -> AsyncIterator[TrainBatch]:
    for batch in batches:
        yield batch


def batches(*steps: int) -> list[TrainBatch]:
    return [TrainBatch(batch_id=f"b{s}", step=s, samples=[sample(f"r{s}", s - 1)]) for s in steps]


async def test_a_resumed_orchestrator_never_holds_what_its_predecessors_batched() -> None:
    held = HeldRollouts(max_off_policy_steps=2)
    await held.resume(
        read_back(
            TrainBatch(batch_id="b3", step=3, samples=[sample("r1", 2)]),
            TrainBatch(batch_id="b2", step=2, samples=[sample("r2", 1)]),
        )
    )
    assert held.published_step == 3 and held.remembered() == 2
    assert not held.hold("r2", delivery("r2", 0, Holds()))


async def test_batched_rollouts_are_remembered_only_while_a_redelivery_could_be_trained() -> None:
    """A redelivered piece of a rollout batched at step s has samples of version s-1 at the
    newest; once batch s+M is out (M = max_off_policy_steps) the next batch takes nothing older
    than version s, so the gate drops it as stale anyway. Ids of older batches are
    forgotten (one step later than the gate needs): a run held every id it ever batched before,
    about 100 B each."""
    held = HeldRollouts(max_off_policy_steps=1)
    for step in range(1, 1001):
        held.mark_batched([f"r{step}a", f"r{step}b"], step)
    assert held.published_step == 1000 and held.remembered() == 4  # steps 999 and 1000
    assert not held.hold("r999a", delivery("r999a", 0, Holds()))
    assert held.hold("r998a", delivery("r998a", 1, Holds()))  # forgotten: the gate drops it
    redelivered = ReadyGroup([sample("r998a", 997)], [0.0], ["r998a"])
    assert StalenessGate(1).fresh([redelivered], version=1000).dropped == 1

    resumed = HeldRollouts(max_off_policy_steps=1)
    await resumed.resume(read_back(*batches(7, 9, 8)))
    assert resumed.published_step == 9 and resumed.remembered() == 2  # steps 8 and 9
    assert not resumed.hold("r8", delivery("r8", 0, Holds()))


async def test_batches_read_back_are_learned_one_at_a_time_in_any_order() -> None:
    """A takeover late in a long run reads every batch of the run back (samples and tokens
    included): each is learned as it is read and then let go, never all held at once; one that
    arrives late and out of the window is passed over."""
    held = HeldRollouts(max_off_policy_steps=1)
    learned_before: list[int] = []

    async def long_run() -> AsyncIterator[TrainBatch]:
        for batch in batches(*range(1, 2001), 1995, 2001, 2002):
            learned_before.append(held.published_step)
            yield batch

    await held.resume(long_run())
    assert learned_before[:4] == [0, 1, 2, 3]  # the previous batch was learned before the next read
    assert held.published_step == 2002 and held.remembered() == 2  # steps 2001 and 2002
    assert held.hold("r1995", delivery("r1995", 0, Holds()))  # too old to remember
    assert not held.hold("r2001", delivery("r2001", 1, Holds()))

    shuffled = HeldRollouts(max_off_policy_steps=2)
    await shuffled.resume(read_back(*batches(5, 9, 7, 8, 6)))
    assert shuffled.published_step == 9 and shuffled.remembered() == 3  # steps 7, 8 and 9
    assert shuffled.hold("r6", delivery("r6", 0, Holds()))


def held_out_group(group_id: str, version: int, *rewards: float, split: str = "test") -> Group:
    members = []
    for i, reward in enumerate(rewards):
        ids = {"rollout_id": f"{group_id}-{i}", "group_id": group_id, "task_id": "t", "env": "e"}
        rollout = RolloutCompleted(**ids, info={SPLIT: split, EVAL_VERSION: version})
        members.append(GroupMember(RolloutScored(**ids, reward=reward), rollout, []))
    return Group(group_id, "e", members)


def test_held_out_sets_go_out_on_the_eval_every_grid_and_the_last_version() -> None:
    cfg = OrchestratorConfig(eval_every=2)
    held_out = HeldOut(cfg, max_steps=5, tasks=TaskSource([], "run", 0.5, 0))
    held_out.start(0)
    evaluated = []
    for served in (0, 0, 1, 3, 4, 5, 5):
        held_out.due(served)
        evaluated.append(sorted(held_out.evaluations))
    assert evaluated[-1] == [0, 3, 4, 5] and evaluated[:2] == [[0], [0]]
    assert held_out.finished()
    restarted = HeldOut(cfg, max_steps=5, tasks=TaskSource([], "run", 0.5, 0))
    restarted.start(3)  # its predecessor evaluated the versions before 3
    restarted.due(3)
    assert not restarted.evaluations and restarted.next_eval == 4
    assert not restarted.finished()


def test_held_out_rewards_go_to_their_evaluation_and_never_to_training() -> None:
    held_out = HeldOut(
        OrchestratorConfig(eval_every=1), max_steps=1, tasks=TaskSource([], "r", 0.5, 0)
    )
    held_out.evaluations[1] = HeldOutEval(1, {"g1", "g2"})
    assert held_out.record(held_out_group("g1", 1, 1.0, 0.0))
    assert not held_out.finished()
    assert held_out.record(held_out_group("g1", 1, 1.0, 1.0))  # a redelivery: counted once
    assert held_out.record(held_out_group("g2", 1, 1.0, 1.0))
    assert held_out.finished()
    assert held_out.summary()[1] == {"mean_reward": 0.75, "pass_rate": 0.75, "rollouts": 4}
    assert not held_out.record(held_out_group("g2", 1, 0.0, split="train"))
    assert held_out.summary()[1] == {"mean_reward": 0.75, "pass_rate": 0.75, "rollouts": 4}


def test_an_evaluation_keeps_its_figures_not_a_reward_per_rollout() -> None:
    """A run of a million steps evaluated every 25 kept 40,000 lists of every held-out reward;
    an evaluation now holds its counts, of one size however many rollouts it scored (200
    groups' rewards made it 7,314 bytes pickled, 2 groups' 186)."""
    sizes = []
    for groups in (2, 200):
        held_out = HeldOut(
            OrchestratorConfig(eval_every=1), max_steps=1, tasks=TaskSource([], "r", 0.5, 0)
        )
        names = [f"g{i}" for i in range(groups)]
        held_out.evaluations[1] = HeldOutEval(1, set(names))
        for name in names:
            held_out.record(held_out_group(name, 1, 1.0, 0.0, 0.5, 0.25))
        assert held_out.summary()[1] == {
            "mean_reward": 0.4375,
            "pass_rate": 0.25,
            "rollouts": 4 * groups,
        }
        sizes.append(len(pickle.dumps(held_out.evaluations[1])))
    assert sizes[1] - sizes[0] < 16, sizes  # a count's digits, not a value per rollout
