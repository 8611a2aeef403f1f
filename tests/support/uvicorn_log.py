"""What uvicorn's error log says while a test closes a server (a close held up by a
connection says "timeout graceful shutdown exceeded" there)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _Kept(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def uvicorn_said() -> Iterator[list[str]]:
    """The messages uvicorn's error logger gives inside the block."""
    lines: list[str] = []
    handler = _Kept(lines)
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
