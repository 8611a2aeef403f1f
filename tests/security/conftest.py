"""Fixtures of the security tests: a scripted model upstream on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import ScriptedServer


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server
