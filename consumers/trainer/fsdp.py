"""FSDP2 behind the Trainer interface: every decoder layer and the root are `fully_shard`ed and
each rank trains its share of a step's micro-batches (TorchRanks). Checkpoints and published
weights are full (gathered) state dicts, the same files as the single-process trainer's.

Under torchrun rank 0 is the bus consumer; `Leader` hands each step's samples to the other
ranks, which run `follow` and take part in the same collectives in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from rlbus.consumers.trainer.checkpoint import CheckpointStore
from rlbus.consumers.trainer.loop import Hooks
from rlbus.consumers.trainer.step import StepResult, Trainer
from rlbus.schemas import TrainSample


def shard(model: nn.Module) -> nn.Module:
    """fully_shard each transformer block, then the whole model (embeddings, head, norms)."""
    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            fully_shard(module)
    fully_shard(model)
    return model


class Leader:
    """Rank 0's trainer: broadcasts the samples, then steps with everyone."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer

    def step(self, samples: Sequence[TrainSample], version: int | None = None) -> StepResult:
        dist.broadcast_object_list([(list(samples), version)], src=0)
        return self.trainer.step(samples, version)

    def stop(self) -> None:
        dist.broadcast_object_list([None], src=0)


def follow(trainer: Trainer, hooks: Hooks, checkpoints: CheckpointStore, version: int) -> None:
    """Ranks > 0: mirror rank 0 (announce, then step + weights + checkpoint per batch) until it
    stops."""
    if not checkpoints.has_weights(version):
        hooks.weights()
    while True:
        box: list[tuple[list[TrainSample], int | None] | None] = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            return
        samples, version = box[0]
        trainer.step(samples, version)
        hooks.weights()
        hooks.state()
