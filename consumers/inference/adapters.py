"""Serving LoRA-delta weight versions (schemas/weights_file.py): each one merged onto the
weights the engine started from, so versions never stack and any one file is enough."""

from __future__ import annotations

import torch

from rlbus.consumers.inference.checkpoint_reader import CheckpointError
from rlbus.schemas.weights_file import LORA_A, LORA_B, adapted_modules


class AdapterMerger:
    """Turns a delta file into (parameter, merged tensor) pairs for the engine's swap.

    The base weights of the adapted layers are copied the first time they are adapted (a
    module adapted by one version and not the next goes back to its base). Once the engine
    has served a full version, the base is gone: a delta after it is refused."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.base: dict[str, torch.Tensor] = {}
        self.merged: dict[str, torch.Tensor] = {}
        """Per adapted weight, the buffer each version is merged into (the engine's swap lock
        keeps one version in it at a time)."""
        self.full_loaded_version: int | None = None

    def full_loaded(self, version: int) -> None:
        self.full_loaded_version = version
        self.base.clear()
        self.merged.clear()

    def pairs(
        self, tensors: dict[str, torch.Tensor], version: int
    ) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        if self.full_loaded_version is not None:
            raise CheckpointError(
                f"weights version {version} is LoRA deltas over the base model, but this worker "
                f"serves full weights of version {self.full_loaded_version}: restart it on the "
                "base model, or publish merged weights (trainer.lora.publish = 'merged')"
            )
        modules = adapted_modules(set(tensors))
        params = dict(self.model.named_parameters())
        problems = misfits(tensors, modules, params)
        if problems:
            raise CheckpointError(
                f"LoRA deltas of weights version {version} do not fit the served model: "
                + "; ".join(problems)
            )
        for module in modules:
            key = module + ".weight"
            if key not in self.base:
                self.base[key] = params[key].detach().clone()
                self.merged[key] = torch.empty_like(self.base[key])
        out = []
        for key, base in self.base.items():
            # Into a buffer kept across versions: the swap copies it into the parameter, and
            # no version allocates the model's size again.
            module, merged = key.removesuffix(".weight"), self.merged[key]
            if module in modules:
                b = tensors[module + LORA_B].to(device=base.device, dtype=base.dtype)
                a = tensors[module + LORA_A].to(device=base.device, dtype=base.dtype)
                torch.addmm(base, b, a, out=merged)
            else:
                merged.copy_(base)
            out.append((params[key], merged))
        return out


def misfits(
    tensors: dict[str, torch.Tensor], modules: list[str], params: dict[str, torch.nn.Parameter]
) -> list[str]:
    """What keeps a delta file from fitting the model, at most a few of each kind."""
    if not modules:
        return ["it adapts no module (no *.lora_A tensors)"]
    expected = {m + suffix for m in modules for suffix in (LORA_A, LORA_B)}
    problems = [f"unexpected tensor {name}" for name in sorted(set(tensors) - expected)[:3]]
    problems += [f"no {m}{LORA_B}" for m in modules if m + LORA_B not in tensors][:3]
    problems += [f"the model has no {m}.weight" for m in modules if m + ".weight" not in params][:3]
    for m in modules:
        if problems:
            break
        a, b, weight = tensors[m + LORA_A], tensors[m + LORA_B], params[m + ".weight"]
        if a.ndim != 2 or b.ndim != 2 or (b.shape[0], a.shape[1]) != tuple(weight.shape):
            problems.append(
                f"{m}: lora_B {tuple(b.shape)} @ lora_A {tuple(a.shape)} does not make its "
                f"weight {tuple(weight.shape)}"
            )
    return problems
