"""The judge: a task set's rewards, metrics and group rewards over rollouts -> `scored`."""

from rlbus.consumers.judge.scoring import Scorer, rollout_arguments
from rlbus.consumers.judge.worker import Judge, group_name, run_judge

__all__ = ["Judge", "Scorer", "group_name", "rollout_arguments", "run_judge"]
