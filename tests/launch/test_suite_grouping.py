"""The suite's own promise to CI: tests that share an expensive module fixture (an
environment's venv, installed by pip for minutes) run on one worker under `--dist loadgroup`
(pyproject's addopts). pytest 9.2 with pytest-xdist 3.8 lost the groups without a word: every
worker installed the venvs again, and CI's test phase grew by a quarter."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("grouping-probe")


def test_a_grouped_test_keeps_its_group_under_loadgroup(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("loadgroup", default=False):
        pytest.skip("not a worker of `pytest -n N --dist loadgroup`: there is no group to keep")
    assert request.node.nodeid.endswith("@grouping-probe"), (
        f"{request.node.nodeid} lost its xdist_group: this pytest and pytest-xdist do not work "
        "together (see pyproject's pin of pytest)"
    )
