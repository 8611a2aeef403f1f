"""How much memory a trainer step needs, checked before training starts, and the micro-batch
size chosen when `trainer.micro_batch_tokens` is unset.

The estimate is deliberately simple: fp32 weights, gradients and AdamW's two moments of the
trainable parameters, one more copy of the weights (the published version being written), a
fixed runtime overhead, and activations linear in the micro-batch's tokens (per layer a
multiple of the hidden size; the logits and their softmax over the vocabulary). Calibrated on
SmolLM2-135M's peak memory on CPU at 1024 and 8192 tokens a micro-batch (docs/benchmarks.md);
attention's quadratic term is left out, so very long rows need more than it says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

FP32 = 4
RUNTIME_BYTES = 1 << 30
"""torch, transformers and the process itself."""
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


class NotEnoughMemory(RuntimeError):
    """The trainer would not fit in the memory available; the message says what to lower."""


@dataclass(frozen=True)
class Estimate:
    fixed_bytes: int
    """Weights, gradients, optimizer state, one published copy and the runtime."""
    per_token_bytes: int
    """Activations per padded token of a micro-batch."""

    def total(self, tokens: int) -> int:
        return self.fixed_bytes + tokens * self.per_token_bytes


def estimate(model: nn.Module, gradient_checkpointing: bool) -> Estimate:
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", 1)
    hidden = getattr(config, "hidden_size", 1)
    vocab = getattr(config, "vocab_size", 1)
    per_layer = CHECKPOINTED_ACTIVATIONS if gradient_checkpointing else LAYER_ACTIVATIONS
    return Estimate(
        fixed_bytes=FP32 * (2 * params + 3 * trainable) + RUNTIME_BYTES,
        per_token_bytes=FP32 * (per_layer * layers * hidden + VOCAB_ACTIVATIONS * vocab),
    )


def available_bytes(device: str) -> int | None:
    """Free memory of the device (CUDA) or MemAvailable of the host; None when unknown."""
    if device.startswith("cuda") and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def micro_batch_tokens(
    model: nn.Module,
    configured: int | None,
    gradient_checkpointing: bool,
    device: str,
    available: int | None = None,
) -> int:
    """The micro-batch size to train with: `configured` when set, else the largest power of two
    whose estimate fits in USABLE of the available memory. Refuses (NotEnoughMemory) when the
    estimate exceeds what is available."""
    est = estimate(model, gradient_checkpointing)
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
            _gb(est.total(tokens)),
            _gb(free) if free is not None else "unknown",
        )
    else:
        tokens = configured
    if free is not None and est.total(tokens) > free:
        hint = (
            "lower trainer.micro_batch_tokens"
            if est.fixed_bytes < free
            else "the weights and optimizer state alone do not fit: use trainer.lora or a "
            "device with more memory"
        )
        if not gradient_checkpointing:
            hint += ", or set trainer.gradient_checkpointing = true"
        raise NotEnoughMemory(
            f"the trainer would need ~{_gb(est.total(tokens))} at trainer.micro_batch_tokens = "
            f"{tokens} ({_gb(est.fixed_bytes)} weights, gradients and AdamW state + "
            f"{_gb(est.per_token_bytes * tokens)} activations); {_gb(free)} is available on "
            f"{device}: {hint}"
        )
    return tokens
