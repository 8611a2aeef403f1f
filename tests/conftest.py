"""Shared fixtures: one real embedded broker (Tansu over TCP) per test session; every test
gets its own topic prefix, so tests never see each other's messages."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlbus.bus import EmbeddedBroker
from rlbus.config import Settings, load_settings


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log) as b:
        yield b


@pytest.fixture
def settings(broker: EmbeddedBroker, tmp_path: Path) -> Settings:
    """Settings for one test: the session broker, a fresh topic prefix and a tmp store path."""
    return load_settings(
        overrides={
            "run_id": f"run-{uuid.uuid4().hex[:8]}",
            "kafka": {
                "bootstrap_servers": broker.bootstrap_servers,
                "topic_prefix": f"t{uuid.uuid4().hex[:8]}.",
                "partitions": 2,
            },
            "store": {"url": f"chdb://{tmp_path / 'store'}", "flush_interval_s": 0.2},
            "claim_check": {"url": str(tmp_path / "claims")},
        }
    )
