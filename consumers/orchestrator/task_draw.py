"""Which tasks the orchestrator publishes: training tasks drawn from each environment's task
set by weight, and a fixed held-out set (chosen by a hash of the task id, so no training task
is ever evaluated on) for evaluations.

Training task ids derive from the run, this task source's start and a counter: a restarted
orchestrator's tasks are new tasks, never repeats of ones its predecessor published (those may
have run already, and env producers skip an id they have seen). Held-out task ids derive from
the run, the version and the task, so an evaluation repeated for a version keeps its ids."""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from rlbus.environment import Environment
from rlbus.schemas import TaskPublished, derived_id, uuid7

log = logging.getLogger(__name__)

SPLIT = "split"
EVAL_VERSION = "eval_version"


def is_held_out(task_id: str, fraction: float) -> bool:
    digest = hashlib.blake2b(task_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


@dataclass
class WeightedEnvironment:
    env: Environment
    weight: float


class TaskSource:
    """Training tasks drawn by environment weight, each environment's training split in epochs:
    when one is used up it starts over in a new order (a near-solved environment whose groups
    are dropped for zero signal goes through its tasks several times faster than steps go)."""

    def __init__(
        self, sources: list[WeightedEnvironment], run_id: str, held_out_fraction: float, seed: int
    ):
        self.sources = sources
        self.run_id = run_id
        self.fraction = held_out_fraction
        self.seed = seed
        self.rng = random.Random(seed)
        self.epochs = {s.env.id: 0 for s in sources}
        self.streams = {s.env.id: self._epoch(s.env, 0) for s in sources}
        self.published = 0
        self.term = uuid7()
        """Names this start of the orchestrator: in its task ids (and in its batch ids when it
        resumed a run), so no id of a previous term is used again."""

    def _epoch(self, env: Environment, epoch: int) -> Iterator[TaskPublished]:
        return iter(
            env.tasks(self.run_id)
            .select(lambda t: not is_held_out(t.task_id, self.fraction))
            .shuffle(self.seed + epoch)
        )

    def skip(self, n: int) -> None:
        """Move past `n` training tasks (a resumed run continues with new ones)."""
        for _ in range(n):
            self.next_train()

    def next_train(self) -> TaskPublished:
        source = self.rng.choices(self.sources, weights=[s.weight for s in self.sources])[0]
        env_id = source.env.id
        task = next(self.streams[env_id], None)
        if task is None:
            self.epochs[env_id] += 1
            log.info(
                "task set of %s used up after %d training tasks; epoch %d begins",
                env_id,
                self.published,
                self.epochs[env_id],
            )
            self.streams[env_id] = self._epoch(source.env, self.epochs[env_id])
            task = next(self.streams[env_id], None)
            if task is None:
                raise RuntimeError(
                    f"task set of {env_id} has no training tasks: no row outside the held-out "
                    f"split (held_out_fraction = {self.fraction})"
                )
        self.published += 1
        return msgspec.structs.replace(
            task,
            event_id=derived_id(self.run_id, "train-task", self.term, self.published),
            run_id=self.run_id,
            info={**task.info, SPLIT: "train"},
        )

    def eval_set(self, version: int, per_env: int, group_size: int) -> list[TaskPublished]:
        tasks = []
        for s in self.sources:
            for task in (
                s.env.tasks(self.run_id)
                .select(lambda t: is_held_out(t.task_id, self.fraction))
                .take(per_env)
            ):
                tasks.append(
                    msgspec.structs.replace(
                        task,
                        event_id=derived_id(self.run_id, "eval-task", version, task.task_id),
                        run_id=self.run_id,
                        group_size=group_size,
                        split="test",
                        min_policy_version=version,
                        info={**task.info, SPLIT: "test", EVAL_VERSION: version},
                    )
                )
        return tasks
