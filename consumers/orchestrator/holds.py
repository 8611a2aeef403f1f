"""Which deliveries the orchestrator keeps uncommitted: every piece of a rollout (trace nodes,
token records, the rollout, its score) until the rollout is batched, evaluated or dropped, so a
restarted orchestrator reads it again instead of losing it; and which rollouts are batched
already (by this process or, read back, its predecessors), never to be held or batched again."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlbus.bus import Delivery
from rlbus.schemas import TrainBatch


class HeldRollouts:
    def __init__(self) -> None:
        self.held: dict[str, list[Delivery]] = {}
        """Deliveries of rollouts not yet batched, evaluated or dropped, by rollout id."""
        self.batched: set[str] = set()
        """Rollouts in batches published so far: never batched again."""
        self.published_step = 0
        """The newest step of those batches."""

    def resume(self, batches: Iterable[TrainBatch]) -> None:
        """Learn the batches earlier orchestrators of the run published."""
        for batch in batches:
            self.batched.update(s.rollout_id for s in batch.samples)
            self.published_step = max(self.published_step, batch.step)

    def hold(self, rollout_id: str, delivery: Delivery) -> bool:
        """Keep a piece of `rollout_id` uncommitted; False (not held) when that rollout is in a
        published batch already: a redelivery after a restart, to be committed past."""
        if rollout_id in self.batched:
            return False
        delivery.hold()
        self.held.setdefault(rollout_id, []).append(delivery)
        return True

    def headers(self, rollout_ids: Iterable[str], topic: str) -> list[Sequence[tuple[str, bytes]]]:
        """The headers of these rollouts' held deliveries from `topic` (their trace contexts)."""
        return [d.headers for r in rollout_ids for d in self.held.get(r, ()) if d.topic == topic]

    def release(self, rollout_ids: Iterable[str]) -> None:
        """Done with these rollouts (evaluated or dropped): commit past them."""
        for rollout_id in rollout_ids:
            for delivery in self.held.pop(rollout_id, ()):
                delivery.release()

    def mark_batched(self, rollout_ids: Sequence[str]) -> None:
        """These rollouts are in a batch the broker acknowledged: the batch is the record now,
        their pieces may be committed, and a redelivery of them is never held again."""
        self.batched.update(rollout_ids)
        self.release(rollout_ids)
