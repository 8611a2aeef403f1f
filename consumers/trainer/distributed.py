"""What the training step needs from its ranks: which micro-batches are mine, and sums over
ranks. One process is the identity; torch.distributed ranks all-reduce."""

from __future__ import annotations

from typing import Protocol, TypeVar

import torch

T = TypeVar("T")


class Ranks(Protocol):
    rank: int
    world: int

    def mine(self, items: list[T]) -> list[T]: ...
    def sum(self, values: torch.Tensor) -> torch.Tensor: ...
    def max(self, value: int) -> int: ...


class SingleProcess:
    rank = 0
    world = 1

    def mine(self, items: list[T]) -> list[T]:
        return items

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def max(self, value: int) -> int:
        return value


class TorchRanks:
    """Ranks of the default process group (gloo on CPU, nccl on GPUs)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError(
                "trainer.parallel = 'fsdp' or 'torchtitan' needs torch.distributed: start the "
                "trainer under torchrun"
            )
        self._dist = dist
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        # nccl reduces only tensors on this rank's GPU; the step's sums are made on the CPU.
        nccl = dist.get_backend() == "nccl"
        self._device = torch.device("cuda", torch.cuda.current_device()) if nccl else None

    def mine(self, items: list[T]) -> list[T]:
        return items[self.rank :: self.world]

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        out = values.to(self._device or values.device, copy=True)
        self._dist.all_reduce(out)
        return out.to(values.device)

    def max(self, value: int) -> int:
        t = torch.tensor([value], device=self._device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX)
        return int(t.item())
