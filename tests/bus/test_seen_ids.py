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


def test_its_memory_is_all_taken_when_it_is_made() -> None:
    """A subscriber's dedup holds the default 200,000 ids in under 5 MB, all of it allocated at
    the start: a role's memory does not climb while it fills (the soak read such filling, ~20 MB
    over each orchestrator's and judge's first quarter hour, as a slope). A set of the ids
    themselves took up to 35 MB, growing."""
    tracemalloc.start()
    try:
        seen = SeenIds()
        made = tracemalloc.get_traced_memory()[0]
        ids = (derived_id("rollout", "run", i) for i in range(250_000))
        assert all(seen.add(event_id) for event_id in ids)
        grown = tracemalloc.get_traced_memory()[0] - made
    finally:
        tracemalloc.stop()
    assert made < 5e6, f"{made / 1e6:.1f} MB"
    assert grown < 50e3, f"{grown / 1e3:.0f} kB more after 250,000 ids"
