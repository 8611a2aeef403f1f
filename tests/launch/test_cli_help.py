"""`rlbus --help` groups commands by job, and every command's help ends with an example."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from rlbus.cli import JOBS, PANELS, app

runner = CliRunner()


def test_help_groups_every_command_by_job_in_order() -> None:
    out = runner.invoke(app, ["--help"], env={"COLUMNS": "120"}).output
    panels = re.findall(r"╭─ (.+?) ─", out)
    assert panels == ["Options", *PANELS]
    for name in JOBS:
        assert re.search(rf"│ {name}\s", out), f"{name} missing from rlbus --help"


def test_each_command_shows_an_example() -> None:
    for name, (_, example) in JOBS.items():
        out = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"}).output
        assert f"Example: {example}" in out, f"rlbus {name} --help has no example"
