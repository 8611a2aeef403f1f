"""Where rlbus's commands print: one console for results, one for errors, and the progress bar
every long step shows."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

console = Console()
err_console = Console(stderr=True)


def progress(*fields: ProgressColumn, disable: bool = False) -> Progress:
    """The progress bar of every command: description, bar, n/total, `fields`, elapsed time."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    return Progress(*columns, *fields, TimeElapsedColumn(), console=console, disable=disable)
