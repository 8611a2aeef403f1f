"""Shared fixtures: one real embedded broker (Tansu over TCP) per test session; every test
gets its own topic prefix, so tests never see each other's messages."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.isolated import isolated_settings

from rlbus.bus import EmbeddedBroker
from rlbus.config import Settings


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log) as b:
        yield b


@pytest.fixture
def settings(broker: EmbeddedBroker, tmp_path: Path) -> Settings:
    """Settings for one test: the session broker, a fresh topic prefix and a tmp store path."""
    return isolated_settings(broker, tmp_path, run_id=f"run-{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory (bpe_model.smollm2_dir: cached)."""
    from support.bpe_model import smollm2_dir as imported

    return imported()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fast tier (`pytest -m fast`): tests of handlers and pure logic, which need neither
    the session broker nor a `slow` mark; tests that start processes or brokers of their own
    are marked `slow` where they are defined."""
    for item in items:
        if "broker" not in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "slow"
        ):
            item.add_marker(pytest.mark.fast)
