"""One optimizer step over a TrainBatch's samples: forward per micro-batch, the configured
loss on policy tokens plus cross-entropy on supervised tokens, gradients accumulated and
normalised by the step's token count, clipping, AdamW, the LR schedule.

`Trainer` is the single-process path; `rlbus.consumers.trainer.fsdp.shard` wraps the same
model for FSDP2 and hands the step a `TorchRanks`, nothing else changes.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from rlbus.config.trainer import OptimConfig, TrainerConfig
from rlbus.consumers.trainer.batching import MicroBatch, micro_batches
from rlbus.consumers.trainer.distributed import Ranks, SingleProcess
from rlbus.consumers.trainer.losses import TokenTensors, get_loss, kl_estimate, supervised_loss
from rlbus.consumers.trainer.memory import estimate, micro_batch_tokens
from rlbus.consumers.trainer.policy import published_kind, token_logprobs
from rlbus.schemas import TrainSample, masks


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    entropy: float
    mismatch_kl: float
    """Mean KL(inference || trainer) per sampled token of samples of the version being trained
    (NaN when the batch has none: older samples' divergence is metrics["off_policy_kl"])."""
    lr: float
    num_samples: int
    num_tokens: int
    """Loss tokens (policy + supervised)."""
    input_tokens: int
    """Every token through the model (what tokens/s counts)."""
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    skipped: str = ""
    """Why the weights did not move this step ("" when they did): an empty batch, or a
    non-finite loss or gradient. The version still advances, with the same weights."""


def lr_factor(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Multiplier of cfg.lr for 0-based `step`."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    if cfg.schedule == "constant" or total_steps <= cfg.warmup_steps:
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    decay = 1 - progress if cfg.schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay


class Trainer:
    def __init__(
        self, model: nn.Module, cfg: TrainerConfig, total_steps: int, ranks: Ranks | None = None
    ):
        self.model = model
        self.cfg = cfg
        self.ranks = ranks or SingleProcess()
        self.loss_fn = get_loss(cfg.loss.name)
        params = [p for p in model.parameters() if p.requires_grad]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(step, o, total_steps)
        )
        self.device = next(model.parameters()).device
        adapters = published_kind(cfg.lora) == "lora-delta"
        self.micro_batch_tokens = micro_batch_tokens(
            estimate(model, cfg.gradient_checkpointing, adapters),
            cfg.micro_batch_tokens,
            str(self.device),
        )
        """cfg.micro_batch_tokens, or the size chosen for the memory available."""

    def _micro_loss(
        self, mb: MicroBatch, version: int | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Summed loss and metric sums of one micro-batch."""
        fields: dict[str, Any] = {
            k: (v.to(self.device) if isinstance(v, torch.Tensor) else v)
            for k, v in vars(mb).items()
        }
        mb_dev = MicroBatch(**fields)
        logprobs, entropy = token_logprobs(self.model, mb_dev)
        policy = mb_dev.loss_mask == masks.POLICY
        supervised = mb_dev.loss_mask == masks.SUPERVISED
        out = self.loss_fn(
            TokenTensors(
                logprobs=logprobs[policy],
                inference_logprobs=mb_dev.inference_logprobs[policy],
                advantages=mb_dev.advantages[policy],
                teacher_logprobs=mb_dev.teacher_logprobs[policy]
                if mb_dev.teacher_logprobs is not None
                else None,
            ),
            self.cfg.loss,
        )
        total = out.loss + supervised_loss(logprobs[supervised], mb_dev.advantages[supervised])
        # Samples of the version being trained measure the trainer/inference numerical mismatch
        # alone; older ones add the policy's own change since they were sampled.
        fresh = (
            torch.tensor([v == version for v in mb.versions], device=self.device)[:, None] & policy
        )
        sums = {
            "policy_tokens": policy.sum().float(),
            "supervised_tokens": supervised.sum().float(),
            "entropy": entropy.sum(),
            "fresh_tokens": fresh.sum().float(),
            "mismatch_kl": kl_estimate(logprobs[fresh], mb_dev.inference_logprobs[fresh]),
            "off_policy_kl": kl_estimate(logprobs[policy], mb_dev.inference_logprobs[policy]),
            "loss": total.detach(),
            **{k: v.detach() for k, v in out.metrics.items()},
        }
        return total, sums

    def step(self, samples: Sequence[TrainSample], version: int | None = None) -> StepResult:
        """Train on `samples` (this rank's share under FSDP is chosen here) with one optimizer step.
        `version`: the weights version being trained (its samples give the mismatch KL)."""
        started = time.perf_counter()
        if not samples:
            return self._skip("empty batch", samples, started)
        groups = self.ranks.mine(micro_batches(samples, self.micro_batch_tokens))
        local = torch.tensor(
            [
                float(sum(int((mb.loss_mask > 0).sum()) for mb in groups)),
                float(sum(mb.num_tokens for mb in groups)),
            ]
        )
        loss_tokens_all, input_tokens = self.ranks.sum(local).tolist()
        tokens = max(1.0, loss_tokens_all)
        # Every rank runs the same number of forward passes (FSDP gathers weights inside them);
        # a rank short of micro-batches repeats one with zero weight.
        passes = self.ranks.max(len(groups))
        sums: dict[str, torch.Tensor] = {}
        self.model.train()
        for i in range(passes):
            mb = groups[i] if i < len(groups) else (groups[0] if groups else _empty_batch())
            loss, metric_sums = self._micro_loss(mb, version)
            weight = 1.0 if i < len(groups) else 0.0
            # Data-parallel gradients are averaged over ranks; the loss is already a mean over
            # every rank's tokens, so each rank's share is scaled back up by the world size.
            (loss * (weight * self.ranks.world / tokens)).backward()
            for k, v in metric_sums.items():
                sums[k] = sums.get(k, torch.zeros((), device=v.device)) + v.float() * weight
        names = sorted(sums)
        reduced = (
            self.ranks.sum(torch.stack([sums[k].cpu() for k in names])) if names else torch.zeros(0)
        )
        totals = dict(zip(names, reduced.tolist(), strict=True))
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], self.cfg.optim.max_grad_norm
        )
        if isinstance(grad_norm, DTensor):  # FSDP: the global norm, from every rank's shard
            grad_norm = grad_norm.full_tensor()
        if not (math.isfinite(totals.get("loss", 0.0)) and math.isfinite(float(grad_norm))):
            # Every rank sees the same reduced loss and global norm, so all skip together.
            self.optimizer.zero_grad(set_to_none=True)
            return self._skip("non-finite loss or gradient", samples, started)
        lr = float(self.scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        policy_tokens = max(1.0, totals.pop("policy_tokens", 0.0))
        loss_tokens = policy_tokens + totals.pop("supervised_tokens", 0.0)
        fresh_tokens = totals.pop("fresh_tokens", 0.0)
        return StepResult(
            loss=totals.pop("loss", 0.0) / tokens,
            grad_norm=float(grad_norm),
            entropy=totals.pop("entropy", 0.0) / max(1.0, loss_tokens),
            mismatch_kl=totals.pop("mismatch_kl", 0.0) / fresh_tokens if fresh_tokens else math.nan,
            lr=lr,
            num_samples=len(samples),
            num_tokens=int(loss_tokens_all),
            input_tokens=int(input_tokens),
            seconds=time.perf_counter() - started,
            metrics={
                "off_policy_kl": totals.pop("off_policy_kl", 0.0) / policy_tokens,
                "fresh_tokens": fresh_tokens,
                **{f"loss/{k}_fraction": v / policy_tokens for k, v in totals.items()},
            },
        )

    def _skip(self, reason: str, samples: Sequence[TrainSample], started: float) -> StepResult:
        """A step that leaves the weights as they are: the LR schedule still advances, since
        the version does."""
        lr = float(self.scheduler.get_last_lr()[0])
        with warnings.catch_warnings():
            # torch warns of a schedule stepped before any optimizer step: here it is meant.
            warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)`")
            self.scheduler.step()
        return StepResult(
            loss=math.nan,
            grad_norm=math.nan,
            entropy=math.nan,
            mismatch_kl=math.nan,
            lr=lr,
            num_samples=len(samples),
            num_tokens=0,
            input_tokens=0,
            seconds=time.perf_counter() - started,
            skipped=reason,
        )


def _empty_batch() -> MicroBatch:
    """Two ids, no loss: the forward pass a rank with no micro-batch of its own still runs."""
    zeros = torch.zeros(1, 2)
    return MicroBatch(
        input_ids=zeros.long(),
        attention_mask=torch.ones(1, 2, dtype=torch.long),
        loss_mask=zeros.to(torch.uint8),
        advantages=zeros,
        inference_logprobs=zeros,
        teacher_logprobs=None,
        temperature=torch.ones(1),
        versions=[0],
    )
