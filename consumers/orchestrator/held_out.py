"""Held-out evaluation: when the held-out tasks go out (once inference serves the first
version, then every eval_every versions and the last one), and the rewards and pass rate of
their groups as they come back. Held-out groups are never trained on."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rlbus.config.orchestrator import OrchestratorConfig
from rlbus.consumers.orchestrator.join import Group
from rlbus.consumers.orchestrator.task_draw import EVAL_VERSION, SPLIT, TaskSource
from rlbus.schemas import TaskPublished, group_id_of

log = logging.getLogger(__name__)


@dataclass
class HeldOutEval:
    """An evaluation's groups still to come and the figures of those scored: counts, not a
    reward per rollout (a long run evaluates thousands of times)."""

    version: int
    pending: set[str]
    rollouts: int = 0
    reward_sum: float = 0.0
    passed: int = 0
    """Rollouts whose reward reached 1."""

    def add(self, rewards: list[float]) -> None:
        self.rollouts += len(rewards)
        self.reward_sum += sum(rewards)
        self.passed += sum(r >= 1 for r in rewards)

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.rollouts if self.rollouts else 0.0

    @property
    def pass_rate(self) -> float:
        return self.passed / self.rollouts if self.rollouts else 0.0


class HeldOut:
    def __init__(self, cfg: OrchestratorConfig, max_steps: int, tasks: TaskSource):
        self.cfg = cfg
        self.max_steps = max_steps
        self.tasks = tasks
        self.evaluations: dict[int, HeldOutEval] = {}
        self.next_eval: int | None = None
        """The version to evaluate next, once inference serves it; None: none is left."""

    def start(self, step: int) -> None:
        """The run stands at `step`. A restart evaluates on the eval_every grid only: the versions
        before it were evaluated by its predecessor (the final one is always evaluated)."""
        self.next_eval = step if step == 0 else self._after(step)

    def _after(self, version: int) -> int:
        """The next version on the eval_every grid after `version`, the final one at most."""
        every = self.cfg.eval_every or self.max_steps
        return min(self.max_steps, (version // every + 1) * every)

    def due(self, served: int) -> list[TaskPublished]:
        """The held-out tasks to publish now that inference serves version `served`: none
        unless an evaluation of it is due."""
        if not self.cfg.eval_every or self.next_eval is None or served < self.next_eval:
            return []
        if served in self.evaluations:
            return []
        self.next_eval = self._after(served) if served < self.max_steps else None
        tasks = self.tasks.eval_set(served, self.cfg.eval_tasks, self.cfg.eval_group_size)
        self.evaluations[served] = HeldOutEval(served, {group_id_of(t) for t in tasks})
        return tasks

    def record(self, group: Group) -> bool:
        """Whether `group` is held out; if so its rewards go to the evaluation that published
        it (once: a group redelivered after a restart, or of an evaluation this process did
        not publish, is passed over)."""
        first = group.members[0].rollout
        if first.info.get(SPLIT) != "test":
            return False
        evaluation = self.evaluations.get(int(first.info.get(EVAL_VERSION, -1)))
        if evaluation is not None and group.group_id in evaluation.pending:
            evaluation.pending.discard(group.group_id)
            evaluation.add([m.scored.reward for m in group.members])
            if not evaluation.pending:
                log.info(
                    "eval at version %d: mean reward %.3f, pass rate %.3f over %d rollouts",
                    evaluation.version,
                    evaluation.mean_reward,
                    evaluation.pass_rate,
                    evaluation.rollouts,
                )
        return True

    def finished(self) -> bool:
        """The final version is evaluated (when evaluations are on) and no evaluation waits for
        groups."""
        final = not self.cfg.eval_every or self.max_steps in self.evaluations
        return final and not any(e.pending for e in self.evaluations.values())

    def summary(self) -> dict[int, dict[str, float]]:
        return {
            v: {"mean_reward": e.mean_reward, "pass_rate": e.pass_rate, "rollouts": e.rollouts}
            for v, e in sorted(self.evaluations.items())
        }
