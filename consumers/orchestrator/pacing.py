"""How many training tasks the orchestrator may publish now, in async mode.

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
