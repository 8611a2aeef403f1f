"""Sink role: every topic into ClickHouse."""

from rlbus.consumers.sink.sink import GROUP, Sink, dedup_token, run_sink

__all__ = ["GROUP", "Sink", "dedup_token", "run_sink"]
