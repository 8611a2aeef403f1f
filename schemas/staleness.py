"""Bounded staleness: a sample whose oldest token was sampled more than `max_off_policy_steps`
versions before the policy being trained is dropped and counted, never trained on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlbus.schemas.events import TrainSample


@dataclass
class Staleness:
    kept: list[TrainSample]
    dropped: int = 0
    histogram: dict[str, int] = field(default_factory=dict)
    """Versions behind -> count, over kept and dropped samples alike."""


def versions_behind(sample: TrainSample, policy_version: int) -> int:
    """`policy_version` is the version being trained; a sample's is that of its oldest token."""
    return max(0, policy_version - sample.policy_version)


def filter_stale(
    samples: Sequence[TrainSample], policy_version: int, max_off_policy_steps: int
) -> Staleness:
    behind = [versions_behind(s, policy_version) for s in samples]
    kept = [s for s, b in zip(samples, behind, strict=True) if b <= max_off_policy_steps]
    histogram = Counter(behind)
    return Staleness(
        kept, len(samples) - len(kept), {str(k): histogram[k] for k in sorted(histogram)}
    )
