"""LoRA-delta weights files over a model directory, as a LoRA trainer writes them (random A and
B, scale folded into B): what the adapter tests and bench/teacher_adapters.py serve."""

from __future__ import annotations

from pathlib import Path

import torch

from rlbus.consumers.trainer.checkpoint import CheckpointStore


def lora_file(
    model_dir: Path, out: Path, seed: int, modules: tuple[str, ...], rank: int, scale: float
) -> str:
    """The URI of a version-`seed` LoRA file adapting the linear layers whose names end with one
    of `modules`, A and B drawn from N(0, scale²)."""
    from transformers import AutoModelForCausalLM

    params = AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, param in params:
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.endswith(modules):
            rows, cols = param.shape
            tensors[module + ".lora_A"] = scale * torch.randn(rank, cols, generator=generator)
            tensors[module + ".lora_B"] = scale * torch.randn(rows, rank, generator=generator)
    store = CheckpointStore(f"file://{out}", weights_kind="lora-delta")
    return store.write_weights(seed, tensors).uri
