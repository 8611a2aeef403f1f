"""Which deliveries the orchestrator keeps uncommitted: every piece of a rollout (trace nodes,
token records, the rollout, its score) until the rollout is batched, evaluated or dropped, so a
restarted orchestrator reads it again instead of losing it; and which rollouts are batched
already (by this process or, read back, its predecessors), never to be held or batched again.

Batched ids are remembered only while a redelivery of them could still be trained: a rollout
batched at step s has samples of version s-1 at the newest, and once batch s+M is out
(M = max_off_policy_steps) the next batch takes none older than version s, so the staleness
gate drops such a redelivery anyway. The ids of the last M+1 steps are kept (one step more than
the gate needs), so memory stays flat over a run of any length."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import AsyncIterable, Iterable, Sequence
from operator import itemgetter

from rlbus.bus import Delivery
from rlbus.schemas import TrainBatch

_STEP = itemgetter(0)


class HeldRollouts:
    def __init__(self, max_off_policy_steps: int) -> None:
        self.held: dict[str, list[Delivery]] = {}
        """Deliveries of rollouts not yet batched, evaluated or dropped, by rollout id."""
        self.keep_steps = max_off_policy_steps + 1
        self._batched: dict[str, int] = {}
        """Rollouts in the last `keep_steps` batches published, with their step."""
        self._steps: deque[tuple[int, Sequence[str]]] = deque()
        """(step, rollout ids) of those batches, oldest first."""

    @property
    def published_step(self) -> int:
        """The newest step of the batches published so far (0: none)."""
        return self._steps[-1][0] if self._steps else 0

    def remembered(self) -> int:
        """Batched rollout ids held in memory."""
        return len(self._batched)

    async def resume(self, batches: AsyncIterable[TrainBatch]) -> None:
        """Learn the batches earlier orchestrators of the run published, in any order, each as
        it is read (bus.topic_reader.events_back): a long run's are never held all at once."""
        async for batch in batches:
            self._remember([s.rollout_id for s in batch.samples], batch.step)

    def _remember(self, rollout_ids: Sequence[str], step: int) -> None:
        if self._steps and step <= self._steps[-1][0] - self.keep_steps:
            return  # older than the window: the staleness gate drops a redelivery of it anyway
        self._batched.update(dict.fromkeys(rollout_ids, step))
        bisect.insort(self._steps, (step, rollout_ids), key=_STEP)  # a few steps long
        while self._steps[0][0] <= self._steps[-1][0] - self.keep_steps:
            old_step, old_ids = self._steps.popleft()
            for rollout_id in old_ids:
                if self._batched.get(rollout_id) == old_step:
                    del self._batched[rollout_id]

    def hold(self, rollout_id: str, delivery: Delivery) -> bool:
        """Keep a piece of `rollout_id` uncommitted; False (not held) when that rollout is in a
        recent published batch already: a redelivery after a restart, to be committed past."""
        if rollout_id in self._batched:
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

    def mark_batched(self, rollout_ids: Sequence[str], step: int) -> None:
        """These rollouts are in the batch of `step`, which the broker acknowledged: the batch is
        the record now, their pieces may be committed, and a redelivery of them is not held
        again."""
        self._remember(rollout_ids, step)
        self.release(rollout_ids)
