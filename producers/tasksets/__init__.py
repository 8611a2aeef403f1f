"""Task sets: where tasks come from."""

from rlbus.producers.tasksets.sources import TaskSourceError, load_tasks, read_rows, to_task

__all__ = ["TaskSourceError", "load_tasks", "read_rows", "to_task"]
