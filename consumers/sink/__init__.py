"""Sink role: every topic into ClickHouse."""

from rlbus.consumers.sink.sink import GROUP, Sink, run_sink

__all__ = ["GROUP", "Sink", "run_sink"]
