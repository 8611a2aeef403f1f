"""A subscriber's memory of the event ids it handled: what it must still recognize, and what it
may cost once full (a long run fills it: bench/soak.py)."""

from __future__ import annotations

import tracemalloc

from rlbus.bus.middleware import SeenIds
from rlbus.schemas import derived_id


def test_recent_ids_are_recognized_and_the_oldest_forgotten() -> None:
    seen = SeenIds(capacity=1_000)
    assert all(seen.add(f"e{i}") for i in range(5_000))
    assert not seen.add("e4999") and not seen.add("e4500")  # the newest half, at least
    assert len({i for i in range(5_000) if not seen.add(f"e{i}")}) <= 1_000
    assert seen.add("e0")  # forgotten: a redelivery this old is the consumer group's to prevent


def test_a_full_set_stays_within_its_memory_budget() -> None:
    """At most 200,000 rollout-sized ids (the default capacity) held, in under 35 MB at the
    peak over more than that many; an ordered dict of them took 47 MB, the judges' growth in the
    soak."""
    tracemalloc.start()
    try:
        seen = SeenIds()
        for i in range(250_000):
            seen.add(derived_id("rollout", "run", i))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 35e6, f"{peak / 1e6:.1f} MB"
