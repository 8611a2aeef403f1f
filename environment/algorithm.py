"""The algorithm hook: how a scored group becomes per-token advantages and loss masks.

    from rlbus.environment import Algorithm, GroupMember, algorithm

    @algorithm("my-algo")
    class MyAlgo(Algorithm):
        async def samples(self, group: list[GroupMember]) -> list[TrainSample]: ...

and `algorithm = "my-algo"` in an environment's entry of the run config. The orchestrator
draws the algorithm from this registry (the built-in ones are in
`rlbus.consumers.orchestrator.algorithms`); the trainer never learns which algorithm made a
sample: it sees mask codes (rlbus.schemas.masks), advantages and log-probs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from rlbus.config.orchestrator import AlgorithmConfig
from rlbus.schemas import RolloutCompleted, RolloutScored, TrainSample


@dataclass
class GroupMember:
    """One rollout of a complete group, with its training samples before the algorithm runs
    (one per trace branch; loss mask 1 on sampled tokens, advantages 0)."""

    scored: RolloutScored
    rollout: RolloutCompleted
    samples: list[TrainSample]


class TokenScorer(Protocol):
    async def score(
        self, prompt_ids: list[int], completion_ids: list[int], temperature: float
    ) -> list[float]: ...

    async def close(self) -> None: ...


@dataclass
class Context:
    """What algorithms may need beyond the group."""

    teacher: TokenScorer | None = None
    encode: Callable[[str], list[int]] | None = None
    """Text -> token ids with the policy's tokenizer (self-distill's hint)."""


class Algorithm:
    def __init__(self, cfg: AlgorithmConfig, ctx: Context):
        self.cfg = cfg
        self.ctx = ctx

    async def samples(self, group: Sequence[GroupMember]) -> list[TrainSample]:
        raise NotImplementedError


ALGORITHMS: dict[str, type[Algorithm]] = {}


def algorithm(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    def register(cls: type[Algorithm]) -> type[Algorithm]:
        if name in ALGORITHMS:
            raise ValueError(f"algorithm {name!r} is registered twice")
        ALGORITHMS[name] = cls
        return cls

    return register
