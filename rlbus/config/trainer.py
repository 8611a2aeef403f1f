"""Trainer settings: the `[trainer]` table of a run config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlbus.config.base import Section


class LossConfig(Section):
    name: str = "rl"
    """Loss for policy tokens: rl (importance ratio + trust-region masking), ppo_clip,
    cross_entropy, distill."""
    trust_region: float = Field(default=0.2, gt=0)
    """rl: a token stops getting gradient once its probability moved this far (absolute) from the
    inference probability in the direction its advantage pushes (DPPO's binary TV mask)."""
    clip_low: float = Field(default=0.2, ge=0)
    """ppo_clip: lower clip of the ratio, 1 - clip_low."""
    clip_high: float = Field(default=0.28, ge=0)
    """ppo_clip: upper clip of the ratio, 1 + clip_high."""
    max_log_ratio: float = Field(default=10.0, gt=0)
    """Log importance ratios are clamped to +-this before exponentiating (overflow guard)."""


class OptimConfig(Section):
    lr: float = Field(default=3e-4, gt=0)
    """Peak learning rate of AdamW."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW decoupled weight decay."""
    beta1: float = Field(default=0.9, ge=0, lt=1)
    """AdamW first-moment decay."""
    beta2: float = Field(default=0.999, ge=0, lt=1)
    """AdamW second-moment decay."""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW epsilon."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradients are clipped to this global L2 norm."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up from 0 to lr over this many steps."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """After warm-up: constant, or decaying (linear/cosine) to min_lr_ratio * lr at max_steps."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Floor of a decaying schedule, as a fraction of lr."""


class LoraConfig(Section):
    enabled: bool = False
    """Train LoRA adapters (peft) instead of every weight."""
    publish: Literal["adapter", "merged"] = "adapter"
    """What a weight version carries: the adapters alone (a few MB; the built-in engine merges
    them onto the base model it started from), or the full weights with the adapters merged
    (what the vLLM backend loads)."""
    rank: int = Field(default=8, ge=1)
    """Rank of the adapters."""
    alpha: float = Field(default=16.0, gt=0)
    """Scaling numerator (scale = alpha / rank)."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapters' input."""
    target_modules: str = "all-linear"
    """Modules to adapt: "all-linear" or a comma-separated list of module names (q_proj,v_proj)."""


class TrainerConfig(Section):
    optim: OptimConfig = OptimConfig()
    loss: LossConfig = LossConfig()
    lora: LoraConfig = LoraConfig()
    micro_batch_tokens: int | None = Field(default=None, ge=1)
    """Padded tokens (rows x longest row) per forward pass; gradients accumulate over micro-
    batches. Unset: derived from the memory available and the model's size (the trainer logs
    the figure it chose). Lower it when the trainer runs out of memory."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass instead of keeping them: the
    same loss and gradients for less memory (activations), at the cost of a second forward
    pass through each layer."""
    device: str = "cpu"
    """Torch device of a single-process trainer (cpu, cuda)."""
    parallel: Literal["none", "fsdp", "torchtitan"] = "none"
    """none: one process; fsdp: FSDP2 (fully_shard) of the transformers model over
    torch.distributed ranks; torchtitan: torchtitan's own model definition (Llama models:
    SmolLM2 and other LlamaForCausalLM checkpoints), loaded from the same Hugging Face
    directory and parallelized by torchtitan (FSDP2) over the ranks; it needs torchtitan
    installed (the gpu extra). Published weights are the same files either way."""
    ranks: int = Field(default=1, ge=1)
    """fsdp, torchtitan: how many processes train (gloo on CPU, one GPU each with nccl). The
    trainer process is rank 0 and starts the others itself; under torchrun its ranks are used
    instead, and this must be 1 or torchrun's WORLD_SIZE."""
    checkpoint_url: str = ""
    """fsspec URL of checkpoints and published weights; empty: <store data
    dir>/checkpoints/<run_id>."""
    checkpoint_every: int = Field(default=10, ge=1)
    """Save the trainer state (model, optimizer: 3x the fp32 weights and more) every this many
    steps, at the last step and on a clean stop; weights are published every step. Batches
    trained since the last saved state stay uncommitted on the bus, so a crash redelivers and
    retrains them: nothing is lost, but up to this many steps are trained again."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Trainer states kept (older ones are deleted once a newer one is complete)."""
    keep_weights: int = Field(default=3, ge=1)
    """Published weight versions kept, so a slow inference worker can still load a recent one
    (inference loads the newest announced; older ones only serve a worker mid-load)."""
    weights_dtype: Literal["bfloat16", "float32", "same"] = "bfloat16"
    """dtype of published weight versions: bfloat16 halves what is written every step and read
    by every inference worker, and is what inference usually computes in (it casts to its own
    dtype on load); float32 publishes the trainer's fp32 master weights exactly; same: the
    trainer's dtype as it is."""
    seed: int = 0
    """Seed of torch's RNG (dropout); data order comes from the batches."""
    threads: int = Field(default=0, ge=0)
    """torch intra-op threads on CPU; 0 leaves torch's default."""

    @property
    def distributed(self) -> bool:
        """Trained by torch.distributed ranks (one or more)."""
        return self.parallel != "none"

    @model_validator(mode="after")
    def _ranks_need_fsdp(self) -> TrainerConfig:
        if self.ranks > 1 and not self.distributed:
            raise ValueError(
                f"trainer.ranks = {self.ranks} needs trainer.parallel = 'fsdp' or 'torchtitan' "
                "(one process trains without it)"
            )
        return self
