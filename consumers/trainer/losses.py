"""Loss registry. A loss sees per-token tensors of the policy tokens of a micro-batch and
returns their summed loss; the trainer divides by the batch's token count, so micro-batches
add up to one mean over the whole step.

    @loss("my-loss")
    def my_loss(t: TokenTensors, cfg: LossConfig) -> LossOutput: ...

and `[trainer.loss] name = "my-loss"` in config. Supervised tokens (mask value 2) get
cross-entropy whichever loss is named (see rlbus.schemas.masks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlbus.config.trainer import LossConfig


@dataclass
class TokenTensors:
    """Flat tensors over the policy tokens of one micro-batch (all shape [n])."""

    logprobs: torch.Tensor
    """Trainer log-probs of the sampled tokens (logits divided by the sampling temperature); with
    grad."""
    inference_logprobs: torch.Tensor
    advantages: torch.Tensor
    teacher_logprobs: torch.Tensor | None = None


@dataclass
class LossOutput:
    loss: torch.Tensor
    """Sum over tokens."""
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    """Sums over tokens (e.g. count of masked tokens); the trainer reports them per token."""


LossFn = Callable[[TokenTensors, LossConfig], LossOutput]
LOSSES: dict[str, LossFn] = {}


def loss(name: str) -> Callable[[LossFn], LossFn]:
    """Register a loss under `name`."""

    def register(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(
                f"loss {name!r} is registered twice ({LOSSES[name].__module__} and {fn.__module__})"
            )
        LOSSES[name] = fn
        return fn

    return register


def get_loss(name: str) -> LossFn:
    if name not in LOSSES:
        raise KeyError(f"unknown loss {name!r}; registered: {sorted(LOSSES)}")
    return LOSSES[name]


def _ratio(t: TokenTensors, cfg: LossConfig) -> torch.Tensor:
    return torch.exp(
        (t.logprobs - t.inference_logprobs).clamp(-cfg.max_log_ratio, cfg.max_log_ratio)
    )


@loss("rl")
def rl_loss(t: TokenTensors, cfg: LossConfig) -> LossOutput:
    """-ratio * A, with tokens masked whose probability already left the trust region in the
    direction the advantage pushes: masking (not clipping) keeps stale samples from dragging
    the policy far, and the rest keep their full importance-weighted gradient."""
    ratio = _ratio(t, cfg)
    with torch.no_grad():
        moved = t.logprobs.exp() - t.inference_logprobs.exp()
        outside = ((t.advantages > 0) & (moved > cfg.trust_region)) | (
            (t.advantages < 0) & (-moved > cfg.trust_region)
        )
    per_token = -(ratio * t.advantages) * (~outside)
    return LossOutput(per_token.sum(), {"masked": outside.sum().float()})


@loss("ppo_clip")
def ppo_clip_loss(t: TokenTensors, cfg: LossConfig) -> LossOutput:
    """PPO's clipped surrogate, with the inference log-probs as the behaviour policy."""
    ratio = _ratio(t, cfg)
    clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    surrogate = torch.minimum(ratio * t.advantages, clipped * t.advantages)
    with torch.no_grad():
        was_clipped = (clipped * t.advantages < ratio * t.advantages).float()
    return LossOutput(-surrogate.sum(), {"clipped": was_clipped.sum()})


@loss("cross_entropy")
def cross_entropy_loss(t: TokenTensors, cfg: LossConfig) -> LossOutput:
    """Negative log-likelihood, weighted by the advantage (1 for plain SFT)."""
    return LossOutput(-(t.advantages * t.logprobs).sum())


@loss("distill")
def distill_loss(t: TokenTensors, cfg: LossConfig) -> LossOutput:
    """Reverse KL to the teacher on the sampled tokens: the gradient of KL(policy || teacher)
    estimated from the inference samples, r * (log pi - log teacher) * grad log pi."""
    if t.teacher_logprobs is None:
        raise ValueError(
            "loss 'distill' needs teacher_logprobs on every sample (algorithm opd or self-distill)"
        )
    ratio = _ratio(t, cfg).detach()
    gap = (t.logprobs - t.teacher_logprobs).detach()
    return LossOutput((ratio * gap * t.logprobs).sum(), {"teacher_gap": gap.sum()})


def supervised_loss(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on supervised tokens (mask value 2), summed."""
    return -(weights * logprobs).sum()


def kl_estimate(logprobs: torch.Tensor, inference_logprobs: torch.Tensor) -> torch.Tensor:
    """Summed per-token estimate of KL(inference || trainer) on the sampled tokens: with
    rho = pi/mu, rho - 1 - log rho is unbiased and never negative (Schulman's k3)."""
    # float64: for the ~1e-6 differences of matching engines, float32 rounds k3 to exactly 0.
    log_rho = (logprobs - inference_logprobs).detach().double()
    return (log_rho.exp() - 1 - log_rho).sum().float()
