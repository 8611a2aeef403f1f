"""The engine's linear layers on CPU: oneDNN matmuls over weights packed once per version.

A plain `nn.Linear` on CPU goes to the BLAS `torch` was built with (MKL), which at a decode
step's few rows leaves most of the step's time in its matmuls; oneDNN's linear over a weight
reordered ahead of time (the kernels `torch.compile` uses on CPU) does the same fp32 (or bf16)
arithmetic faster at a decode step's rows on the larger layers (bench/real_model.py; the
figures are in docs/benchmarks.md). Each call costs more than a plain one, so small layers (a
tiny test model's, a 135M model's key and value projections) stay plain.

The original weight stays the module's parameter: names, tied embeddings, weight swaps and
LoRA merges see the model unchanged, and a parameter changed in place (its version counter
moves) is packed again before the next forward. The price is a second copy of each packed
weight in memory. Only forward passes without autograd use the packed weight.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

DECODE_ROWS = 32
"""The row count the packed layout is chosen for (oneDNN's hint); other counts run on it too."""
MIN_WEIGHTS = 1 << 18
"""Layers with fewer weights are left plain: below it the call's extra cost outweighs the
faster matmul (docs/benchmarks.md has the sizes where packing paid and where it cost)."""


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), DECODE_ROWS)


def _packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """An nn.Linear's parameters, with the weight also packed for oneDNN."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self._packed: torch.Tensor | None = None
        self._packed_at = -1
        """The weight's version counter when it was packed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        if self._packed is None or self._packed_at != self.weight._version:
            self._packed, self._packed_at = _pack(self.weight), self.weight._version
        return _packed_linear(x, self._packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def _supported(model: nn.Module) -> str | None:
    """Why the model's linears cannot be packed here; None when they can."""
    param = next(model.parameters())
    if param.device.type != "cpu":
        return f"on {param.device.type}"
    if param.dtype not in (torch.float32, torch.bfloat16):
        return f"{param.dtype} weights"
    if not torch.backends.mkldnn.is_available():
        return "torch was built without oneDNN"
    try:  # a private op of torch's: probe it rather than trust its presence
        w = torch.randn(8, 16, dtype=param.dtype)
        x = torch.randn(3, 16, dtype=param.dtype)
        got = _packed_linear(x, _pack(w), None)
    except (AttributeError, RuntimeError) as exc:
        return f"oneDNN's packed linear failed ({exc})"
    tolerance = 1e-4 if param.dtype == torch.float32 else 3e-2
    if not torch.allclose(got, F.linear(x, w), atol=tolerance, rtol=tolerance):
        return "oneDNN's packed linear disagrees with F.linear"
    return None


def pack_linears(model: nn.Module) -> int:
    """Replace the model's nn.Linear layers of MIN_WEIGHTS weights or more by PackedLinear in
    place; the number replaced (0 where packing is not supported: the reason is logged)."""
    reason = _supported(model)
    if reason is not None:
        log.info("linear layers left unpacked: %s", reason)
        return 0
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and child.weight.numel() >= MIN_WEIGHTS
    ]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
    return len(targets)
