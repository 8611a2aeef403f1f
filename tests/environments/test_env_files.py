"""The environment file `rlbus run` writes for a run's env producers and judges, from each
`[envs.NAME]` path form its docstring names (env.toml, a directory, module:Class, FILE.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlbus.config.orchestrator import EnvEntry
from rlbus.environment import load_environment
from rlbus.launch.env_files import env_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("path", "taskset"),
    [
        ("reverse_text/terse.toml", "TerseReverseText"),
        ("reverse_text", "ReverseText"),
        ("rlbus.environment.reverse_text:TerseReverseText", "TerseReverseText"),
        ("calculator/env.py", "Calculator"),
    ],
)
def test_every_path_form_gives_an_environment_with_the_runs_model(
    tmp_path: Path, path: str, taskset: str
) -> None:
    entry = EnvEntry(path=path, overrides={"group_size": 3})
    written = env_file(entry, "mine", EXAMPLES, tmp_path, "models/m", ["http://127.0.0.1:1/v1"])
    env = load_environment(str(written))
    assert type(env.taskset).__name__ == taskset
    assert env.id == "mine" and env.config.group_size == 3
    assert env.config.model.mode == "train"
    assert env.config.model.base_url == "http://127.0.0.1:1/v1"
