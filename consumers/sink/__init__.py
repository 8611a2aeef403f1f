"""Sink role: every topic into ClickHouse."""

from rlbus.consumers.sink.sink import GROUP, Sink, hold_store, run_sink

__all__ = ["GROUP", "Sink", "hold_store", "run_sink"]
