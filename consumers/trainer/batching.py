"""Samples -> micro-batches of padded tensors. Micro-batches are packed by padded size
(rows x longest row <= the token budget), longest samples first, so padding stays small and
memory per forward pass stays bounded whatever the batch size."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rlbus.schemas import TrainSample
from rlbus.schemas.packed import logprobs, mask, tokens


def pack(lengths: Sequence[int], budget_tokens: int) -> list[list[int]]:
    """Indices of each micro-batch. A sample longer than the budget gets a micro-batch alone
    (the orchestrator drops those over seq_len before they get here)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        # Longest first: a group's first sample is its longest, so its padded size is known.
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@dataclass
class MicroBatch:
    input_ids: torch.Tensor
    """[B, T] int64, right-padded."""
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    """[B, T] uint8 mask codes (rlbus.schemas.masks); position i scores token i given tokens < i."""
    advantages: torch.Tensor
    inference_logprobs: torch.Tensor
    teacher_logprobs: torch.Tensor | None
    temperature: torch.Tensor
    """[B] sampling temperature of each row."""
    versions: list[int]

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())


def _check(sample: TrainSample) -> int:
    n = len(tokens(sample.input_ids))
    sizes = {
        "loss_mask": len(mask(sample.loss_mask)),
        "advantages": len(logprobs(sample.advantages)),
        "inference_logprobs": len(logprobs(sample.inference_logprobs)),
    }
    if sample.teacher_logprobs:
        sizes["teacher_logprobs"] = len(logprobs(sample.teacher_logprobs))
    wrong = {k: v for k, v in sizes.items() if v != n}
    if wrong:
        raise ValueError(f"sample of rollout {sample.rollout_id}: {n} input ids but {wrong}")
    if n and mask(sample.loss_mask)[0]:
        raise ValueError(
            f"sample of rollout {sample.rollout_id}: the first token has loss but no prefix to "
            f"predict it"
        )
    return n


def collate(samples: Sequence[TrainSample]) -> MicroBatch:
    lengths = [_check(s) for s in samples]
    rows, width = len(samples), max(lengths)

    def padded(field: str, unpack, dtype) -> np.ndarray:
        out = np.zeros((rows, width), dtype=dtype)
        for r, s in enumerate(samples):
            values = unpack(getattr(s, field))
            out[r, : len(values)] = values
        return out

    has_teacher = any(s.teacher_logprobs for s in samples)
    attention = np.zeros((rows, width), dtype=np.int64)
    for r, n in enumerate(lengths):
        attention[r, :n] = 1
    return MicroBatch(
        input_ids=torch.from_numpy(padded("input_ids", tokens, np.int64)),
        attention_mask=torch.from_numpy(attention),
        loss_mask=torch.from_numpy(padded("loss_mask", mask, np.uint8)),
        advantages=torch.from_numpy(padded("advantages", logprobs, np.float32)),
        inference_logprobs=torch.from_numpy(padded("inference_logprobs", logprobs, np.float32)),
        teacher_logprobs=torch.from_numpy(padded("teacher_logprobs", logprobs, np.float32))
        if has_teacher
        else None,
        temperature=torch.tensor([s.temperature or 1.0 for s in samples], dtype=torch.float32),
        versions=[s.policy_version for s in samples],
    )


def micro_batches(samples: Sequence[TrainSample], budget_tokens: int) -> list[MicroBatch]:
    lengths = [len(tokens(s.input_ids)) for s in samples]
    return [collate([samples[i] for i in group]) for group in pack(lengths, budget_tokens)]
