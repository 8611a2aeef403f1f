"""The judge: a task set's rewards, metrics and group rewards over rollouts -> `scored`."""

from rlbus.consumers.judge.worker import Judge, group_name, run_judge

__all__ = ["Judge", "group_name", "run_judge"]
