"""FSDP2 behind the Trainer interface: every decoder layer and the root are `fully_shard`ed and
each rank trains its share of a step's micro-batches (TorchRanks). Checkpoints and published
weights are full (gathered) state dicts, the same files as the single-process trainer's.

Under torchrun rank 0 is the bus consumer; `Leader` tells the other ranks what it does next (a
step and its samples, gathering the weights or the state), and they run `follow`, taking part
in the same collectives in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from rlbus.consumers.trainer.batch_trainer import Hooks
from rlbus.consumers.trainer.step import StepResult, Trainer
from rlbus.schemas import TrainSample


def shard(model: nn.Module) -> nn.Module:
    """fully_shard each transformer block, then the whole model (embeddings, head, norms)."""
    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            fully_shard(module)
    fully_shard(model)
    return model


Order = tuple[str, list[TrainSample], int | None] | None
"""What rank 0 does next: ("step", samples, version), ("weights", [], None), ("state", [],
None), or None: stop."""


def _tell(order: Order) -> None:
    dist.broadcast_object_list([order], src=0)


class Leader:
    """Rank 0's trainer: tells the others each step and gather, then does it with them."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer

    def step(self, samples: Sequence[TrainSample], version: int | None = None) -> StepResult:
        _tell(("step", list(samples), version))
        return self.trainer.step(samples, version)

    def hooks(self, own: Hooks) -> Hooks:
        """Rank 0's hooks, each telling the followers to gather with it first."""

        def told(kind: str, gather: Callable[[], dict]) -> Callable[[], dict]:
            def run() -> dict:
                _tell((kind, [], None))
                return gather()

            return run

        return Hooks(told("weights", own.weights), told("state", own.state), own.num_params)

    def stop(self) -> None:
        _tell(None)


def follow(trainer: Trainer, hooks: Hooks) -> None:
    """Ranks > 0: mirror rank 0's steps and gathers until it stops."""
    gathers = {"weights": hooks.weights, "state": hooks.state}
    while True:
        box: list[Order] = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            return
        kind, samples, version = box[0]
        if kind == "step":
            trainer.step(samples, version)
        else:
            gathers[kind]()
