"""Task sets: where tasks come from."""

from rlbus.environment.task_sources.sources import (
    TaskSourceError,
    load_tasks,
    read_rows,
    reasoning_gym,
    to_task,
)
from rlbus.environment.task_sources.stream import TaskStream

__all__ = ["TaskSourceError", "TaskStream", "load_tasks", "read_rows", "reasoning_gym", "to_task"]
