"""Sink role: every topic into ClickHouse."""

from rlbus.consumers.sink.sink import GROUP, Sink, dedup_token, hold_store, run_sink

__all__ = ["GROUP", "Sink", "dedup_token", "hold_store", "run_sink"]
