"""When the orchestrator batches and how many training tasks it publishes, by mode (picked once,
by `pacing_for`): SyncPacing runs a step's tasks, batches them once all are back, and waits for
inference to serve the new weights; AsyncPacing batches as soon as a step's groups are ready and
keeps tasks in flight as the Pacer allows.

How many training tasks may go out in async mode (the Pacer):

Tasks are paced in the groups they are expected to yield: when most groups are dropped
(zero signal on a nearly solved task set, too-long samples), a step needs several times
`tasks_per_step` tasks, and a bound on tasks alone would starve the trainer. The expected
yield is the share of the last few steps' training groups that reached a batch.

Groups whose every rollout errored (the model unreachable, a harness broken) say nothing about
the yield: they are left out of it, and while they are most of what comes back the pacer backs
off, to one step's worth of tasks in flight and then none for a while, doubling the wait from
BACKOFF_S up to MAX_BACKOFF_S while groups keep erroring, instead of sending ever more tasks into
the failure (each erroring at once, thousands a minute).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rlbus.config.orchestrator import OrchestratorConfig

BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0

MIN_KEEP_RATE = 1 / 8
"""Below this the estimate is floored: at most 8x oversampling, however few groups are kept."""


class Pacer:
    def __init__(
        self,
        tasks_per_step: int,
        max_off_policy_steps: int,
        max_inflight_tasks: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ):
        """`max_inflight_tasks`: a hard bound on tasks in flight; 0: two steps' worth of expected
        groups."""
        self.clock = clock
        self.backoff_s = BACKOFF_S
        self.paused_until = 0.0
        """While failing: no task goes out before this time (clock())."""
        self.tasks_per_step = tasks_per_step
        self.max_off_policy_steps = max_off_policy_steps
        self.max_inflight_tasks = max_inflight_tasks
        self.kept: deque[bool] = deque(maxlen=4 * tasks_per_step)
        """Whether each recent training group that did not error reached the ready list."""
        self.errored: deque[bool] = deque(maxlen=4 * tasks_per_step)
        """Whether each recent training group errored whole."""

    def observe(self, kept: bool, errored: bool = False) -> None:
        self.errored.append(errored)
        if not errored:
            self.kept.append(kept)
            self.backoff_s = BACKOFF_S
        elif self.failing and self.clock() >= self.paused_until:
            self.paused_until = self.clock() + self.backoff_s
            self.backoff_s = min(MAX_BACKOFF_S, 2 * self.backoff_s)

    @property
    def failing(self) -> bool:
        """Most recent groups errored whole."""
        return len(self.errored) >= self.tasks_per_step and 2 * sum(self.errored) > len(
            self.errored
        )

    @property
    def keep_rate(self) -> float:
        """Expected groups per task (1 until groups have come back)."""
        if not self.kept:
            return 1.0
        return max(MIN_KEEP_RATE, sum(self.kept) / len(self.kept))

    def max_inflight(self) -> int:
        if self.failing:
            return min(self.tasks_per_step, self.max_inflight_tasks or self.tasks_per_step)
        return self.max_inflight_tasks or math.ceil(2 * self.tasks_per_step / self.keep_rate)

    def room(self, step: int, max_steps: int, ready: int, inflight: int, served: int) -> int:
        """Tasks that may go out now, at batch `step` with `ready` groups waiting and `inflight`
        tasks out: within the in-flight bound; only as many as are expected to land in batches
        no more than max_off_policy_steps ahead of the version inference serves (each would
        otherwise be sampled only to be dropped as stale); and up to one step's worth beyond
        max_steps, so that the final batch, like every other, is made of the first groups back
        instead of waiting for the slowest (the spares are stored, not trained on)."""
        if self.failing and self.clock() < self.paused_until:
            return 0
        rate = self.keep_rate
        groups_wanted = (max_steps - step + 1) * self.tasks_per_step - ready
        wanted = math.ceil(groups_wanted / rate) - inflight
        room, limit = 0, min(self.max_inflight() - inflight, wanted)
        while room < limit:
            trained_at = step + int((ready + (inflight + room) * rate) // self.tasks_per_step)
            if trained_at - max(served, 0) > self.max_off_policy_steps:
                break
            room += 1
        return room


@dataclass(frozen=True)
class Progress:
    """Where the run stands, as a pacing policy sees it."""

    step: int
    """Batches published so far."""
    ready: int
    """Groups waiting for a batch."""
    inflight: int
    """Training tasks published whose groups have not come back."""
    served: int
    """The newest version inference serves."""
    start_version: int
    """The trainer's first announced version."""


class Pacing(Protocol):
    pacer: Pacer
    """Observed with every training group in either mode: it says when groups error whole."""

    def may_batch(self, at: Progress) -> int | None:
        """How many ready groups to batch now (the oldest ones); None: no batch now."""
        ...

    def batched(self, published: bool) -> None:
        """The batch may_batch asked for went out (False: none of its samples was fresh enough,
        so nothing was published)."""
        ...

    def tasks_to_publish(self, at: Progress) -> int:
        """Training tasks to publish now, after batching; they are published."""
        ...


class AsyncPacing:
    """async: rollouts of the next steps run while the trainer trains."""

    def __init__(self, pacer: Pacer, tasks_per_step: int, max_steps: int):
        self.pacer = pacer
        self.tasks_per_step = tasks_per_step
        self.max_steps = max_steps

    def may_batch(self, at: Progress) -> int | None:
        if at.ready >= self.tasks_per_step and at.step < self.max_steps:
            return self.tasks_per_step
        return None

    def batched(self, published: bool) -> None:
        """Nothing to change: a stale batch's groups are gone, the next ones are batched."""

    def tasks_to_publish(self, at: Progress) -> int:
        if at.served < at.start_version:
            return 0  # on a resume, inference first loads the trainer's weights
        return self.pacer.room(at.step, self.max_steps, at.ready, at.inflight, at.served)


class SyncPacing:
    """sync: each step's tasks go out once inference serves the version the last batch trained
    (the trainer's first one at the start), and its batch once every group has come back."""

    def __init__(self, pacer: Pacer, tasks_per_step: int, max_steps: int):
        self.pacer = pacer
        self.tasks_per_step = tasks_per_step
        self.max_steps = max_steps
        self.collecting = False
        """This step's tasks are out; its batch goes when all have come back."""
        self.another_round = False
        """Every group of the step came back (some may have been dropped) with nothing to train
        on: the step gets another round of tasks instead of an empty batch."""

    def may_batch(self, at: Progress) -> int | None:
        every_group_back = self.collecting and not at.inflight and not self.another_round
        return at.ready if every_group_back and at.step < self.max_steps else None

    def batched(self, published: bool) -> None:
        if published:
            self.collecting = False
        else:
            self.another_round = True

    def tasks_to_publish(self, at: Progress) -> int:
        if at.step >= self.max_steps:
            return 0
        if self.another_round:
            self.another_round = False
            return self.tasks_per_step
        # Batch `step` trains version step-1 into version `step`: once inference serves that,
        # the next step's rollouts are sampled by the newest weights.
        if not self.collecting and at.served >= at.step:
            self.collecting = True
            return self.tasks_per_step
        return 0


def pacing_for(cfg: OrchestratorConfig, max_steps: int) -> Pacing:
    """The pacing policy cfg.mode names."""
    pacer = Pacer(cfg.tasks_per_step, cfg.max_off_policy_steps, cfg.max_inflight_tasks)
    kind = AsyncPacing if cfg.mode == "async" else SyncPacing
    return kind(pacer, cfg.tasks_per_step, max_steps)
