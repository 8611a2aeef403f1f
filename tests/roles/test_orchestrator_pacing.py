"""Task pacing in async mode: in-flight and staleness bounds counted in the groups tasks are
expected to yield, so dropped groups (zero signal) do not starve the trainer; and which ready
groups a batch takes."""

from __future__ import annotations

from rlbus.consumers.orchestrator.pacing import MIN_KEEP_RATE, Pacer
from rlbus.consumers.orchestrator.staleness_gate import ReadyGroup, take_oldest
from rlbus.schemas import TrainSample


def observed(pacer: Pacer, kept: int, dropped: int) -> Pacer:
    for i in range(kept + dropped):
        pacer.observe(i < kept)
    return pacer


def test_every_group_kept_paces_two_steps_of_tasks() -> None:
    pacer = Pacer(tasks_per_step=16, max_off_policy_steps=2)
    assert pacer.keep_rate == 1.0 and pacer.max_inflight() == 32
    assert pacer.room(step=0, max_steps=100, ready=0, inflight=0, served=0) == 32
    assert pacer.room(step=0, max_steps=100, ready=0, inflight=30, served=0) == 2
    # Inference serves version 3 while batch 5 is next: only what lands in batch 5 may go out.
    assert pacer.room(step=5, max_steps=100, ready=10, inflight=0, served=3) == 6


def test_dropped_groups_raise_the_bounds_in_proportion() -> None:
    pacer = observed(Pacer(tasks_per_step=16, max_off_policy_steps=2), kept=16, dropped=48)
    assert pacer.keep_rate == 0.25 and pacer.max_inflight() == 128
    assert pacer.room(step=0, max_steps=100, ready=0, inflight=0, served=0) == 128
    # Staleness: batch 5 needs 6 more groups, which 24 tasks are expected to yield.
    assert pacer.room(step=5, max_steps=100, ready=10, inflight=0, served=3) == 24


def test_keep_rate_has_a_floor_and_an_explicit_bound_is_hard() -> None:
    starved = observed(Pacer(tasks_per_step=16, max_off_policy_steps=2), kept=0, dropped=64)
    assert starved.keep_rate == MIN_KEEP_RATE and starved.max_inflight() == 256
    bounded = observed(
        Pacer(tasks_per_step=16, max_off_policy_steps=2, max_inflight_tasks=40), kept=1, dropped=63
    )
    assert bounded.room(step=0, max_steps=100, ready=0, inflight=0, served=0) == 40


def test_the_estimate_follows_recent_groups() -> None:
    pacer = observed(Pacer(tasks_per_step=4, max_off_policy_steps=2), kept=0, dropped=16)
    assert pacer.keep_rate == MIN_KEEP_RATE
    observed(pacer, kept=16, dropped=0)  # the window is 4 steps of groups: the drops are forgotten
    assert pacer.keep_rate == 1.0


def test_spares_beyond_max_steps_are_one_step_of_expected_groups() -> None:
    pacer = observed(Pacer(tasks_per_step=16, max_off_policy_steps=8), kept=32, dropped=32)
    # The last batch (step 9 of 10) and one spare step: 32 groups wanted, 16 ready, half kept.
    assert pacer.room(step=9, max_steps=10, ready=16, inflight=0, served=9) == 32
    assert pacer.room(step=9, max_steps=10, ready=16, inflight=32, served=9) == 0


def group(name: str, *versions: int) -> ReadyGroup:
    return ReadyGroup(
        [
            TrainSample(
                rollout_id=f"{name}{i}",
                input_ids=b"",
                loss_mask=b"",
                advantages=b"",
                inference_logprobs=b"",
                policy_version=v,
            )
            for i, v in enumerate(versions)
        ],
        [0.0] * len(versions),
        [f"{name}{i}" for i in range(len(versions))],
    )


def test_a_batch_takes_the_groups_sampled_longest_ago_first() -> None:
    # Arrival order: a fresh group came back before two older ones (rollouts finish out of order).
    ready = [group("a", 7, 7), group("b", 5, 6), group("c", 6, 6), group("d", 5, 5)]
    taken, rest = take_oldest(ready, 2)
    assert [g.samples[0].rollout_id for g in taken] == [
        "b0",
        "d0",
    ]  # oldest first, arrival order among equals
    assert [g.samples[0].rollout_id for g in rest] == ["c0", "a0"]


def test_groups_that_errored_whole_back_off_instead_of_multiplying_tasks() -> None:
    """A model outage errors every group at once: those say nothing about the yield (on main
    they cut the keep rate to 1/8 and the orchestrator sent 8x the tasks into the outage);
    while they are most of what comes back, at most one step's worth of tasks is in flight,
    and none for a while after each new error, the wait doubling."""
    now = [0.0]
    pacer = Pacer(tasks_per_step=16, max_off_policy_steps=2, clock=lambda: now[0])
    pacer = observed(pacer, kept=16, dropped=16)
    assert pacer.keep_rate == 0.5 and pacer.max_inflight() == 64
    for _ in range(48):
        pacer.observe(kept=False, errored=True)
    assert pacer.keep_rate == 0.5 and pacer.failing
    assert pacer.max_inflight() == 16
    assert pacer.room(step=0, max_steps=100, ready=0, inflight=10, served=0) == 0  # paused 1 s
    now[0] = 1.0
    assert pacer.room(step=0, max_steps=100, ready=0, inflight=10, served=0) == 6
    pacer.observe(kept=False, errored=True)  # still failing: the next pause is 2 s
    assert pacer.room(step=0, max_steps=100, ready=0, inflight=0, served=0) == 0
    now[0] = 3.0
    assert pacer.room(step=0, max_steps=100, ready=0, inflight=0, served=0) == 16
    for _ in range(64):
        pacer.observe(kept=True)
    assert not pacer.failing and pacer.max_inflight() == 32
