"""What a batch is made of: the ready groups sampled longest ago, and of their samples only
those no more than max_off_policy_steps versions behind the policy being trained
(schemas/staleness.py measures it); the others are dropped, and counted by the caller."""

from __future__ import annotations

from dataclasses import dataclass

from rlbus.schemas import TrainSample
from rlbus.schemas.staleness import Staleness, filter_stale


@dataclass
class ReadyGroup:
    samples: list[TrainSample]
    rewards: list[float]
    rollout_ids: list[str]
    env: str = ""
    """The environment the group came from: its algorithm names the batch."""

    @property
    def oldest_version(self) -> int:
        return min(s.policy_version for s in self.samples)


def take_oldest(ready: list[ReadyGroup], groups: int) -> tuple[list[ReadyGroup], list[ReadyGroup]]:
    """The `groups` sampled longest ago (in arrival order among equals), and the rest. Rollouts
    come back out of order: a group near the staleness bound goes into this batch before it
    expires, while a fresher one can wait a step."""
    ordered = sorted(ready, key=lambda g: g.oldest_version)
    return ordered[:groups], ordered[groups:]


class StalenessGate:
    def __init__(self, max_off_policy_steps: int):
        self.max_off_policy_steps = max_off_policy_steps

    def fresh(self, groups: list[ReadyGroup], version: int) -> Staleness:
        """The samples of `groups` that a batch training `version` may take (the next batch
        trains the version of the batches published so far), how many are too stale, and the
        staleness histogram of all of them."""
        samples = [s for g in groups for s in g.samples]
        return filter_stale(samples, version, self.max_off_policy_steps)
