"""Task sets: where tasks come from."""

from rlbus.producers.tasksets.sources import (
    TaskSourceError,
    load_tasks,
    read_rows,
    reasoning_gym,
    to_task,
)
from rlbus.producers.tasksets.stream import TaskStream

__all__ = ["TaskSourceError", "TaskStream", "load_tasks", "read_rows", "reasoning_gym", "to_task"]
