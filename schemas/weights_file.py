"""What the safetensors file a `WeightVersion` points at holds, shared by the trainer that
writes it and the inference workers that load it.

A file is either the model's full weights (tied duplicates left out), or, when the trainer
trains LoRA adapters and publishes them alone, each adapted linear layer's low-rank delta
over the base model the run started from:

    <module>.lora_A   [rank, in]
    <module>.lora_B   [out, rank], already multiplied by the adapter's scale (alpha / rank)

so that `<module>.weight` served = base `<module>.weight` + lora_B @ lora_A. A version is a
delta over the base, never over the previous version: any one file is enough to serve it.
The file's safetensors metadata names its kind under `KIND_KEY`; `WeightVersion.format`
names it on the event.
"""

from __future__ import annotations

from typing import Literal

KIND_KEY = "rlbus.weights"
WeightsKind = Literal["full", "lora-delta"]
FORMATS: dict[WeightsKind, str] = {"full": "safetensors", "lora-delta": "safetensors-lora"}
"""`WeightVersion.format` of each kind."""
LORA_A, LORA_B = ".lora_A", ".lora_B"


def adapted_modules(names: list[str] | set[str]) -> list[str]:
    """The modules a LoRA-delta file adapts, from its tensor names."""
    return sorted(n.removesuffix(LORA_A) for n in names if n.endswith(LORA_A))
