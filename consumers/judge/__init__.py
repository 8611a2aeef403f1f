"""The judge: a task set's rewards, metrics and group rewards over rollouts -> `scored`."""

from rlbus.consumers.judge.main import Judge, group_name

__all__ = ["Judge", "group_name"]
