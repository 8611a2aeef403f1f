"""Command-line arguments doing what their help says: `--env` on `rlbus tasks publish` names the
environment of rows without one, an environment's tasks carry its configured id, and the
judge's ENV list stops where the overrides begin."""

from __future__ import annotations

from pathlib import Path

from rlbus.bus.waiting import wait_for
from rlbus.config import Settings
from rlbus.environment import load_environment
from rlbus.environment.task_sources import load_tasks
from rlbus.launch.processes import RoleProcess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_env_option_names_only_rows_without_an_env_column() -> None:
    rows = [
        {"prompt": "a", "answer": "1", "env": "math"},
        {"prompt": "b", "answer": "2"},
        {"question": "c", "answer": "3", "task": "spelling"},
    ]
    assert [t.env for t in load_tasks(rows, env="fallback")] == ["math", "fallback", "spelling"]


def test_an_environments_tasks_carry_its_configured_id() -> None:
    # command_agent runs the reverse_text task set under id "reverse_text_agent"; its rows are
    # TaskPublished events the generator made with env "reverse_text".
    env = load_environment(str(EXAMPLES / "command_agent"))
    assert env.id == "reverse_text_agent"
    assert {t.env for t in env.tasks("r").take(5)} == {"reverse_text_agent"}
    renamed = load_environment(str(EXAMPLES / "guess_number"), {"id": "guessing"})
    assert {t.env for t in renamed.tasks().take(3)} == {"guessing"}


def test_judge_takes_overrides_after_its_environments(settings: Settings, tmp_path: Path) -> None:
    judge = RoleProcess(
        "judge",
        settings,
        tmp_path,
        [str(EXAMPLES / "reverse_text"), str(EXAMPLES / "guess_number"), "--run-id", "judged"],
    )
    try:
        wait_for(
            lambda: "judge for reverse_text, guess_number (run 'judged')" in judge.log_tail(),
            60,
            "the judge to start",
            check=judge.check,
        )
    finally:
        code = judge.stop()
    assert code == 0, judge.log_tail()
