"""How much memory a trainer needs, checked before the model is loaded (from the directory's
sizes: consumers/model_size.py) and again once it is (from its parameters), and the
micro-batch size chosen when `trainer.micro_batch_tokens` is unset. Both checks go through
one formula, `trainer_estimate`.

The estimate is deliberately simple: fp32 weights, gradients and AdamW's two moments of the
trainable parameters (with LoRA, the adapters alone), one more copy of what a version
publishes (the weights being written; with LoRA adapters published alone, the adapters), a
fixed runtime overhead, and activations linear in the micro-batch's tokens (per layer a
multiple of the hidden size; the logits and their softmax over the vocabulary). Calibrated on
SmolLM2-135M's peak memory on CPU at 1024 and 8192 tokens a micro-batch (docs/benchmarks.md);
attention's quadratic term is left out, so very long rows need more than it says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlbus.config.trainer import TrainerConfig
from rlbus.consumers.model_size import (
    RUNTIME_BYTES,
    ModelSize,
    NotEnoughMemory,
    available_bytes,
    gb,
    model_size,
)

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)

FP32 = 4
LAYER_ACTIVATIONS = 24
"""Floats kept per token per layer, in units of the hidden size (attention and MLP inputs,
their intermediate products, norms), without gradient checkpointing."""
CHECKPOINTED_ACTIVATIONS = 2
"""With gradient checkpointing: each layer's input, plus one layer recomputed at a time."""
VOCAB_ACTIVATIONS = 4
"""Floats per token per vocabulary entry: logits, log-softmax, and their gradients."""
USABLE = 0.6
"""Share of the available memory an automatic micro-batch size plans to use."""
AUTO_RANGE = (256, 16384)
"""Bounds of an automatic micro_batch_tokens (a power of two)."""


@dataclass(frozen=True)
class Estimate:
    weights_bytes: int
    """The fp32 weights (LoRA: the base and the adapters)."""
    training_bytes: int
    """Gradients and AdamW's two moments of the trainable parameters."""
    published_bytes: int
    """One copy of what a version publishes, while it is written."""
    runtime_bytes: int
    per_token_bytes: int
    """Activations per padded token of a micro-batch."""
    gradient_checkpointing: bool
    lora: bool

    @property
    def fixed_bytes(self) -> int:
        """Weights, gradients, optimizer state, one published copy and the runtime."""
        return self.weights_bytes + self.training_bytes + self.published_bytes + self.runtime_bytes

    def total(self, tokens: int) -> int:
        return self.fixed_bytes + tokens * self.per_token_bytes

    def describe(self, tokens: int) -> str:
        """The estimate at `tokens` a micro-batch and its parts, for a person."""
        training = "adapters' gradients and AdamW state" if self.lora else "gradients and AdamW"
        return (
            f"~{gb(self.total(tokens))} at trainer.micro_batch_tokens = {tokens} "
            f"({gb(self.weights_bytes)} fp32 weights + {gb(self.training_bytes)} {training} + "
            f"{gb(self.published_bytes)} published copy + {gb(self.runtime_bytes)} runtime + "
            f"{gb(self.per_token_bytes * tokens)} activations)"
        )

    def hint(self, free: int) -> str:
        """What to change when the estimate exceeds `free` bytes."""
        if self.fixed_bytes < free:
            hint = "lower trainer.micro_batch_tokens"
            if not self.gradient_checkpointing:
                hint += ", or set trainer.gradient_checkpointing = true"
            return hint
        lora = "" if self.lora else "set trainer.lora.enabled = true (only adapters train), "
        return (
            f"the weights and optimizer state alone do not fit: {lora}use a smaller model, "
            "or a device with more memory (trainer.device)"
        )


def trainer_estimate(
    params: int,
    trainable: int,
    layers: int,
    hidden: int,
    vocab: int,
    gradient_checkpointing: bool,
    adapters_published: bool,
) -> Estimate:
    """The formula, from the model's sizes: `params` every parameter (adapters included),
    `trainable` those that train; `adapters_published`: a version carries the adapters alone."""
    per_layer = CHECKPOINTED_ACTIVATIONS if gradient_checkpointing else LAYER_ACTIVATIONS
    return Estimate(
        weights_bytes=FP32 * params,
        training_bytes=FP32 * 3 * trainable,
        published_bytes=FP32 * (trainable if adapters_published else params),
        runtime_bytes=RUNTIME_BYTES,
        per_token_bytes=FP32 * (per_layer * layers * hidden + VOCAB_ACTIVATIONS * vocab),
        gradient_checkpointing=gradient_checkpointing,
        lora=trainable < params,
    )


def estimate(
    model: nn.Module, gradient_checkpointing: bool, adapters_published: bool = False
) -> Estimate:
    """The estimate of a loaded model, from its parameters."""
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    config = getattr(model, "config", None)
    return trainer_estimate(
        params,
        trainable,
        getattr(config, "num_hidden_layers", 1),
        getattr(config, "hidden_size", 1),
        getattr(config, "vocab_size", 1),
        gradient_checkpointing,
        adapters_published,
    )


def estimate_from_size(size: ModelSize, cfg: TrainerConfig) -> Estimate:
    """The estimate of the model `size` describes, trained as `cfg` says, before loading it."""
    lora = cfg.lora
    adapters = size.adapter_params(lora.rank, lora.target_modules) if lora.enabled else 0
    return trainer_estimate(
        size.params + adapters,
        adapters if lora.enabled else size.params,
        size.layers,
        size.hidden,
        size.vocab,
        cfg.gradient_checkpointing,
        lora.enabled and lora.publish == "adapter",
    )


def least_tokens(cfg: TrainerConfig) -> int:
    """The micro-batch a trainer with `cfg` would train with at the least: the configured one,
    else the smallest an automatic choice takes."""
    return cfg.micro_batch_tokens or AUTO_RANGE[0]


def refusal(est: Estimate, tokens: int, free: int, device: str) -> NotEnoughMemory:
    return NotEnoughMemory(
        f"the trainer would need {est.describe(tokens)}; {gb(free)} is available on "
        f"{device}: {est.hint(free)}"
    )


def check_training_fits(
    cfg: TrainerConfig, model_path: str | Path, available: int | None = None
) -> Estimate | None:
    """Refuse (NotEnoughMemory) a trainer whose estimate at its micro-batch size exceeds the
    memory of cfg.device, from the model directory's sizes alone: no weight is read. None when
    the directory does not tell its sizes."""
    size = model_size(model_path)
    if size is None:
        return None
    est = estimate_from_size(size, cfg)
    free = available if available is not None else available_bytes(cfg.device)
    tokens = least_tokens(cfg)
    if free is not None and est.total(tokens) > free:
        raise refusal(est, tokens, free, cfg.device)
    log.info(
        "trainer memory estimate before loading (%s): %s; %s available",
        size.source,
        est.describe(tokens),
        gb(free) if free is not None else "unknown",
    )
    return est


def micro_batch_tokens(
    est: Estimate, configured: int | None, device: str, available: int | None = None
) -> int:
    """The micro-batch size to train with: `configured` when set, else the largest power of two
    whose estimate fits in USABLE of the available memory. Refuses (NotEnoughMemory) when the
    estimate exceeds what is available."""
    free = available if available is not None else available_bytes(device)
    low, high = AUTO_RANGE
    if configured is None:
        tokens = high
        if free is not None:
            while tokens > low and est.total(tokens) > USABLE * free:
                tokens //= 2
        log.info(
            "trainer.micro_batch_tokens unset: %d (estimated %s of %s available)",
            tokens,
            gb(est.total(tokens)),
            gb(free) if free is not None else "unknown",
        )
    else:
        tokens = configured
    if free is not None and est.total(tokens) > free:
        raise refusal(est, tokens, free, device)
    return tokens
