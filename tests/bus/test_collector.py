"""The collector policy of long-running processes (rlbus.launch.collector)."""

from __future__ import annotations

import gc

from rlbus.launch.collector import YOUNGEST_THRESHOLD, steady_collector


def test_steady_collector_freezes_the_heap_and_collects_less_until_left() -> None:
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    with steady_collector():
        assert gc.get_freeze_count() > frozen
        assert gc.get_threshold()[0] >= YOUNGEST_THRESHOLD
        assert gc.get_threshold()[1:] == threshold[1:]
    assert gc.get_threshold() == threshold
    assert gc.get_freeze_count() == 0


def test_steady_collector_restores_the_collector_when_its_body_fails() -> None:
    threshold = gc.get_threshold()
    try:
        with steady_collector():
            raise ValueError("the body failed")
    except ValueError:
        pass
    assert (gc.get_threshold(), gc.get_freeze_count()) == (threshold, 0)


def test_cycles_made_inside_are_still_collected() -> None:
    with steady_collector():
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
