"""Training samples from the store: the exact token ids and loss masks of stored rollouts
(trace nodes + token records, read by bus.store.rollouts), never re-rendered text.
`rlbus replay sft` trains on them."""

from __future__ import annotations

from dataclasses import dataclass

from rlbus.bus.store import Store
from rlbus.bus.store.rollout_reader import NO_TOKENS_HELP, describe, read_rollouts
from rlbus.consumers.orchestrator.algorithms import AlgorithmConfig, GroupMember, make_algorithm
from rlbus.schemas import RolloutCompleted, TrainSample
from rlbus.schemas.samples import trace_samples


class ReplayError(ValueError):
    """The selection matched nothing usable; the message says what was found."""


@dataclass
class StoredSamples:
    samples: list[TrainSample]
    rollouts: int
    """Rollouts the samples came from."""
    without_tokens: int
    """Selected rollouts left out because they hold no token ids."""


async def stored_samples(
    store: Store, where: str, run_id: str | None = None, version: str = ""
) -> StoredSamples:
    """SFT samples of the matching rollouts (scores as bus.store.rollouts.read_rollouts chooses
    them): one per trace branch, supervised on sampled tokens."""
    stored = list(read_rollouts(store, where, run_id, version, tokens=True))
    if not stored:
        raise ReplayError(f"no scored rollout matches {describe(where, run_id, version)}")
    usable = [s for s in stored if s.has_tokens]
    if not usable:
        raise ReplayError(
            f"{len(stored):,} rollouts match but none holds token ids: {NO_TOKENS_HELP}"
        )
    algo = make_algorithm(AlgorithmConfig(name="sft"))
    out: list[TrainSample] = []
    for s in usable:
        score = s.score
        rollout = s.rollout or RolloutCompleted(
            rollout_id=score.rollout_id,
            group_id=score.group_id,
            task_id=score.task_id,
            env=score.env,
        )
        samples = trace_samples(s.nodes, s.records)
        out.extend(await algo.samples([GroupMember(score, rollout, samples)]))
    return StoredSamples(out, len(usable), len(stored) - len(usable))
