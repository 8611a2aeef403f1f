"""LoRA adapters served beside the model's own weights, by name, for scoring: several
distillation teachers trained as LoRA experts of one base are one engine and one copy of the
base, each chosen per request (`model` in POST /v1/score), instead of a merged model apiece.

An adapter is applied unmerged while a forward pass runs under it: each adapted layer's output
gets `(x @ A.T) @ B.T` added (B holds the adapter's scale, schemas/weights_file.py), through
forward hooks that are removed when the pass ends. Unmerged, one adapter's pass costs two
thin matmuls per adapted layer and leaves the weights as loaded; merging would copy every
adapted weight on each switch. The layers it adapts and their shapes are checked when it is
added, as AdapterMerger checks a LoRA version.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from rlbus.consumers.inference.adapters import misfits
from rlbus.consumers.inference.checkpoint_reader import CheckpointError, read_checkpoint
from rlbus.schemas.weights_file import LORA_A, LORA_B, adapted_modules

Lora = dict[str, tuple[torch.Tensor, torch.Tensor]]
"""An adapter: per adapted module, its A [rank, in] and B [out, rank] (scale folded in)."""


class ServedAdapters:
    """The adapters an engine scores with, by name, over the model it was given."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.adapters: dict[str, Lora] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.adapters)

    def add(self, name: str, uri: str) -> None:
        """Serve the LoRA-delta checkpoint at `uri` as `name`, or CheckpointError saying why
        it cannot be (full weights, layers the model lacks or of other shapes)."""
        checkpoint = read_checkpoint(uri)
        if checkpoint.kind != "lora-delta":
            raise CheckpointError(
                f"adapter {name!r} ({uri}) holds {checkpoint.kind} weights, not LoRA deltas: "
                "serve full weights as a model of their own"
            )
        modules = adapted_modules(set(checkpoint.tensors))
        params = dict(self.model.named_parameters())
        problems = misfits(checkpoint.tensors, modules, params)
        if problems:
            raise CheckpointError(
                f"adapter {name!r} ({uri}) does not fit the served model: " + "; ".join(problems)
            )
        lora: Lora = {}
        for module in modules:
            weight = params[module + ".weight"]
            a, b = (
                checkpoint.tensors[module + suffix].to(device=weight.device, dtype=weight.dtype)
                for suffix in (LORA_A, LORA_B)
            )
            lora[module] = (a, b)
        self.adapters[name] = lora

    @contextlib.contextmanager
    def applied(self, name: str | None) -> Iterator[None]:
        """Forward passes inside run under adapter `name` (None: the model's own weights)."""
        if name is None:
            yield
            return
        modules = dict(self.model.named_modules())
        hooks = [
            modules[module].register_forward_hook(_adding(a, b))
            for module, (a, b) in self.adapters[name].items()
        ]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()


Hook = Callable[[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor]


def _adding(a: torch.Tensor, b: torch.Tensor) -> Hook:
    def hook(
        module: torch.nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor
    ) -> torch.Tensor:
        return out + (args[0] @ a.T) @ b.T

    return hook
