"""Algorithms (advantages and mask codes against hand-computed values) and the joiner."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from rlbus.consumers.orchestrator.algorithms import (
    AlgorithmConfig,
    Context,
    GroupMember,
    group_advantages,
    make_algorithm,
    teacher_kl,
)
from rlbus.consumers.orchestrator.join import Joiner
from rlbus.consumers.orchestrator.orchestration import has_signal
from rlbus.schemas import (
    RolloutCompleted,
    RolloutScored,
    TokenRecord,
    TraceNode,
    TrainSample,
    derived_id,
    masks,
)
from rlbus.schemas.packed import logprobs, mask, pack_logprobs, pack_mask, pack_tokens, tokens


def member(
    i: int, reward: float, sampled: list[int], completion_tokens: int = 3, answer: str = "cba"
) -> GroupMember:
    ids = list(range(10, 10 + len(sampled)))
    sample = TrainSample(
        rollout_id=f"r{i}",
        input_ids=pack_tokens(ids),
        loss_mask=pack_mask(sampled),
        advantages=pack_logprobs([0.0] * len(ids)),
        inference_logprobs=pack_logprobs([-0.5 * s for s in sampled]),
    )
    scored = RolloutScored(
        rollout_id=f"r{i}",
        group_id="g",
        task_id="t",
        env="e",
        sample_index=i,
        group_size=3,
        reward=reward,
        completion_tokens=completion_tokens,
    )
    rollout = RolloutCompleted(
        rollout_id=f"r{i}", group_id="g", task_id="t", env="e", answer=answer
    )
    return GroupMember(scored, rollout, [sample])


async def run(
    name: str, group: list[GroupMember], ctx: Context | None = None, **cfg: object
) -> list[TrainSample]:
    return await make_algorithm(AlgorithmConfig(name=name, **cfg), ctx).samples(group)


async def test_grpo_is_reward_minus_group_mean_on_sampled_tokens() -> None:
    group = [member(0, 1.0, [0, 1, 1]), member(1, 0.0, [0, 1, 1]), member(2, 0.5, [0, 0, 1])]
    out = await run("grpo", group)
    assert [logprobs(s.advantages).tolist() for s in out] == [
        [0, 0.5, 0.5],
        [0, -0.5, -0.5],
        [0, 0, 0],
    ]
    assert [mask(s.loss_mask).tolist() for s in out] == [[0, 1, 1], [0, 1, 1], [0, 0, 1]]
    assert not has_signal([out[2]]) and has_signal(out)


def test_group_advantage_options() -> None:
    cfg = AlgorithmConfig(length_penalty=0.5)
    # rewards 1,1 with lengths 2,4: shaped 1 - 0.25, 1 - 0.5 -> mean 0.625 -> +0.125, -0.125
    assert group_advantages([1, 1], [2, 4], cfg).tolist() == pytest.approx([0.125, -0.125])
    std = group_advantages([1, 0], [1, 1], AlgorithmConfig(normalize_std=True))
    assert std.tolist() == pytest.approx([1, -1], abs=1e-4)


def test_a_group_with_no_trainable_member_has_no_advantages_and_no_warning() -> None:
    """Every member errored (test_learning's CI log: numpy's "Mean of empty slice")."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for cfg in (AlgorithmConfig(), AlgorithmConfig(normalize_std=True, length_penalty=1)):
            assert group_advantages([], [], cfg).tolist() == []


async def test_sft_marks_sampled_tokens_supervised() -> None:
    out = await run("sft", [member(0, 0.0, [0, 1, 1])])
    assert mask(out[0].loss_mask).tolist() == [0, masks.SUPERVISED, masks.SUPERVISED]
    assert logprobs(out[0].advantages).tolist() == [0, 1, 1]


async def test_echo_adds_cross_entropy_on_environment_tokens() -> None:
    # prompt, sampled, tool result, sampled: RL on 1 and 3, cross-entropy on 2, nothing on 0
    group = [member(0, 1.0, [0, 1, 0, 1]), member(1, 0.0, [0, 1, 0, 1])]
    out = await run("echo", group, echo_weight=0.3)
    assert mask(out[0].loss_mask).tolist() == [0, masks.POLICY, masks.SUPERVISED, masks.POLICY]
    assert logprobs(out[0].advantages).tolist() == pytest.approx([0, 0.5, 0.3, 0.5])


class FakeTeacher:
    def __init__(self) -> None:
        self.calls: list[tuple[list[int], list[int], float]] = []

    async def score(
        self, prompt_ids: list[int], completion_ids: list[int], temperature: float
    ) -> list[float]:
        self.calls.append((prompt_ids, completion_ids, temperature))
        return [-0.25] * len(completion_ids)

    async def close(self) -> None:
        """Holds no connection."""


async def test_opd_advantage_is_teacher_minus_policy_logprob() -> None:
    teacher = FakeTeacher()
    out = await run(
        "opd", [member(0, 0.0, [0, 1, 1])], Context(teacher=teacher), teacher_url="http://t"
    )
    # inference log-probs -0.5 on sampled tokens: -0.25 - (-0.5) = 0.25
    assert logprobs(out[0].advantages).tolist() == [0, 0.25, 0.25]
    assert logprobs(out[0].teacher_logprobs).tolist() == [0, -0.25, -0.25]
    assert teacher.calls == [([10], [11, 12], 1.0)]


async def test_self_distill_shows_the_teacher_a_hint() -> None:
    teacher = FakeTeacher()
    await run(
        "self-distill",
        [member(0, 0.0, [0, 0, 1], answer="xyz")],
        Context(teacher=teacher, encode=lambda text: [ord(c) for c in text]),
        hint="A:{answer};",
    )
    assert teacher.calls[0][0] == [*map(ord, "A:xyz;"), 10, 11]


async def test_unknown_algorithm_and_missing_teacher_are_named() -> None:
    with pytest.raises(KeyError, match="grpo"):
        make_algorithm(AlgorithmConfig(name="nope"))
    with pytest.raises(ValueError, match="teacher_url"):
        await run("opd", [member(0, 0.0, [0, 1])])


def trace(rollout: str, group: str, prompt: list[int], completion: list[int]) -> list:
    n0, n1 = derived_id(rollout, "n0"), derived_id(rollout, "n1")
    return [
        TraceNode(
            node_id=n0, rollout_id=rollout, index=0, role="user", token_ids=pack_tokens(prompt)
        ),
        TokenRecord(
            rollout_id=rollout,
            group_id=group,
            call_index=0,
            node_id=n1,
            prompt_ids=pack_tokens(prompt),
            completion_ids=pack_tokens(completion),
            logprobs=pack_logprobs([-1.0] * len(completion)),
            policy_version=3,
        ),
        TraceNode(
            node_id=n1,
            rollout_id=rollout,
            parent_id=n0,
            index=1,
            role="assistant",
            token_ids=pack_tokens(completion),
            sampled=True,
            call_index=0,
        ),
    ]


def test_joiner_waits_for_every_piece_of_every_member() -> None:
    joiner = Joiner("run", {"e"}, temperature=lambda env: 0.7)
    events = []
    for i in range(2):
        rid = f"r{i}"
        events += trace(rid, "g", [1, 2, 3], [4, 5])
        events.append(
            RolloutCompleted(
                run_id="run",
                rollout_id=rid,
                group_id="g",
                task_id="t",
                env="e",
                sample_index=i,
                group_size=2,
                num_turns=1,
            )
        )
        events.append(
            RolloutScored(
                run_id="run",
                rollout_id=rid,
                group_id="g",
                task_id="t",
                env="e",
                sample_index=i,
                group_size=2,
                reward=float(i),
            )
        )
    for e in events:
        e.run_id = "run"
    # Everything but the last trace node: not ready. Order across topics does not matter.
    last_node = events[2]
    for e in reversed(events):
        if e is not last_node:
            joiner.add(e)
    assert joiner.ready() == []
    joiner.add(last_node)
    (group,) = joiner.ready()
    assert [m.scored.reward for m in group.members] == [0.0, 1.0]
    s = group.members[0].samples[0]
    assert tokens(s.input_ids).tolist() == [1, 2, 3, 4, 5]
    assert mask(s.loss_mask).tolist() == [0, 0, 0, 1, 1]
    assert s.policy_version == 3 and s.temperature == 0.7
    assert joiner.ready() == [] and not joiner.parts
    np.testing.assert_array_equal(logprobs(s.inference_logprobs), [0, 0, 0, -1, -1])


def test_training_tasks_go_round_in_epochs_and_never_include_held_out_ones() -> None:
    from pathlib import Path

    from rlbus.consumers.orchestrator.task_draw import TaskSource, WeightedEnvironment, is_held_out
    from rlbus.environment import load_environment

    env = load_environment(
        str(Path(__file__).resolve().parents[2] / "examples" / "reverse_text"),
        {"args": {"n": 40}},
    )
    source = TaskSource([WeightedEnvironment(env, 1.0)], "run", held_out_fraction=0.2, seed=0)
    train = [t.task_id for t in env.tasks("run") if not is_held_out(t.task_id, 0.2)]
    drawn = [source.next_train() for _ in range(2 * len(train))]
    first, second = (
        [t.task_id for t in drawn[: len(train)]],
        [t.task_id for t in drawn[len(train) :]],
    )
    assert (
        sorted(first) == sorted(second) == sorted(train) and first != second
    )  # each epoch reshuffled
    assert len({t.event_id for t in drawn}) == len(drawn)  # every publication its own task event


async def test_teacher_kl_is_per_environment_over_the_sampled_tokens() -> None:
    """What a batch reports of each teacher: the mean of policy minus teacher log-prob over the
    tokens the policy sampled (an estimate of KL(policy || teacher)), per environment; groups
    scored by no teacher are not in it."""
    distilled = await run(
        "opd",
        [member(0, 0.0, [0, 1, 1]), member(1, 0.0, [1, 0, 1, 1])],
        Context(teacher=FakeTeacher()),
        teacher_url="http://t",
    )
    plain = await run("grpo", [member(2, 1.0, [1, 1]), member(3, 0.0, [1, 1])], Context())
    kl = teacher_kl([(s, "reverse_text") for s in distilled] + [(s, "other") for s in plain])
    # inference -0.5, teacher -0.25 on every sampled token: -0.5 - (-0.25)
    assert kl == {"teacher_kl.reverse_text": -0.25}
