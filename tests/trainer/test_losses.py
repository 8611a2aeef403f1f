"""Losses against values worked out by hand (probabilities chosen so the arithmetic is exact)."""

from __future__ import annotations

import math

import pytest
import torch

from rlbus.consumers.trainer.losses import (
    LossConfig,
    TokenTensors,
    get_loss,
    kl_estimate,
    supervised_loss,
)


def lp(*probs: float) -> torch.Tensor:
    return torch.tensor([math.log(p) for p in probs], dtype=torch.float64)


def tokens(
    policy: tuple[float, ...],
    inference: tuple[float, ...],
    advantages: tuple[float, ...],
    teacher: tuple[float, ...] | None = None,
) -> TokenTensors:
    return TokenTensors(
        lp(*policy).requires_grad_(),
        lp(*inference),
        torch.tensor(advantages, dtype=torch.float64),
        lp(*teacher) if teacher else None,
    )


def test_rl_loss_is_importance_weighted_and_masks_outside_the_trust_region() -> None:
    # token 0: ratio 0.5/0.25 = 2, A=+1, moved +0.25 > 0.2 in A's direction -> masked
    # token 1: ratio 2, A=-1, moved up while A pushes down -> kept: -(2 * -1) = 2
    # token 2: ratio 0.3/0.4 = 0.75, A=+2, moved -0.1 -> kept: -(0.75 * 2) = -1.5
    # token 3: ratio 0.1/0.4 = 0.25, A=-1, moved -0.3 past 0.2 in A's direction -> masked
    t = tokens((0.5, 0.5, 0.3, 0.1), (0.25, 0.25, 0.4, 0.4), (1.0, -1.0, 2.0, -1.0))
    out = get_loss("rl")(t, LossConfig(trust_region=0.2))
    assert out.loss.item() == pytest.approx(2 - 1.5)
    assert out.metrics["masked"].item() == 2
    out.loss.backward()
    # d/dlogp of -(r*A) = -r*A: zero where masked
    assert t.logprobs.grad.tolist() == pytest.approx([0.0, 2.0, -1.5, 0.0])


def test_rl_loss_on_policy_equals_reinforce() -> None:
    t = tokens((0.2, 0.7), (0.2, 0.7), (0.5, -0.25))
    out = get_loss("rl")(t, LossConfig())
    assert out.loss.item() == pytest.approx(-(0.5 - 0.25))
    out.loss.backward()
    assert t.logprobs.grad.tolist() == pytest.approx([-0.5, 0.25])


def test_ppo_clip_takes_the_pessimistic_side() -> None:
    # ratio 2 with A=+1 clips at 1.28 -> -1.28; ratio 0.5 with A=-1: min(-0.5, -0.8) = -0.8 -> +0.8
    # ratio 1 with A=+3: -3
    t = tokens((0.5, 0.2, 0.3), (0.25, 0.4, 0.3), (1.0, -1.0, 3.0))
    out = get_loss("ppo_clip")(t, LossConfig(clip_low=0.2, clip_high=0.28))
    assert out.loss.item() == pytest.approx(-1.28 + 0.8 - 3.0)
    assert out.metrics["clipped"].item() == 2
    out.loss.backward()
    assert t.logprobs.grad.tolist() == pytest.approx(
        [0.0, 0.0, -3.0]
    )  # clipped tokens get no gradient


def test_cross_entropy_is_weighted_nll() -> None:
    t = tokens((0.5, 0.25), (0.5, 0.25), (1.0, 2.0))
    assert get_loss("cross_entropy")(t, LossConfig()).loss.item() == pytest.approx(
        math.log(2) + 2 * math.log(4)
    )
    assert supervised_loss(
        lp(0.5), torch.tensor([1.0], dtype=torch.float64)
    ).item() == pytest.approx(math.log(2))


def test_distill_gradient_is_the_reverse_kl_gradient() -> None:
    # on-policy (ratio 1): d/dlogp = log pi - log teacher
    t = tokens((0.5, 0.1), (0.5, 0.1), (0.0, 0.0), teacher=(0.25, 0.4))
    out = get_loss("distill")(t, LossConfig())
    out.loss.backward()
    assert t.logprobs.grad.tolist() == pytest.approx([math.log(2), math.log(0.25)])
    assert out.metrics["teacher_gap"].item() == pytest.approx(math.log(2) + math.log(0.25))
    with pytest.raises(ValueError, match="teacher_logprobs"):
        get_loss("distill")(tokens((0.5,), (0.5,), (0.0,)), LossConfig())


def test_mismatch_kl_is_zero_when_equal_and_k3_otherwise() -> None:
    assert kl_estimate(lp(0.3, 0.9), lp(0.3, 0.9)).item() == pytest.approx(0.0)
    # rho = 0.5/0.25 = 2: 2 - 1 - ln 2
    assert kl_estimate(lp(0.5), lp(0.25)).item() == pytest.approx(1 - math.log(2))


def test_unknown_loss_names_the_registered_ones() -> None:
    with pytest.raises(KeyError, match="ppo_clip"):
        get_loss("nope")
