"""Runs of the reverse_text example that several test folders start: in this process
(`run_config` for `support.in_process`) and as `rlbus run` subprocesses (`rlbus_run`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rlbus.config import Settings, load_settings
from rlbus.config.runs import RunConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"


def run_config(settings: Settings, model: Path, tmp: Path, **orchestrator: object) -> RunConfig:
    data = settings.model_dump(mode="json", exclude_none=True)
    return load_settings(
        EXAMPLE / "rl.toml",
        model=RunConfig,
        overrides={
            **data,
            "model": str(model),
            "max_steps": 4,
            "orchestrator": {
                "tasks_per_step": 4,
                "eval_every": 2,
                "eval_tasks": 8,
                "held_out_fraction": 0.2,
                **orchestrator,
            },
            "trainer": {"checkpoint_url": str(tmp / "ckpt"), "threads": 1},
            "envs": {
                "reverse_text": {
                    "path": str(EXAMPLE / "env.toml"),
                    "overrides": {
                        "group_size": 4,
                        "max_concurrent_rollouts": 16,
                        "sampling": {"temperature": 1.0, "max_tokens": 10},
                    },
                }
            },
        },
    )


def run_args(tmp: Path, model: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlbus",
        "run",
        str(EXAMPLE / "rl.toml"),
        "--model",
        str(model),
        "--run-id",
        "cli",
        "--store.url",
        f"chdb://{tmp / 'store'}",
        "--claim-check.url",
        str(tmp / "claims"),
        "--orchestrator.tasks-per-step",
        "4",
        "--orchestrator.eval-every",
        "0",
        "--envs.reverse_text.overrides.group-size",
        "4",
    ]


def said(log: Path, text: str) -> bool:
    """Whether a role's log has said `text` yet."""
    return log.exists() and text in log.read_text(errors="replace")


def rlbus_run(
    tmp: Path, model: Path, *extra: str, timeout_s: float = 240
) -> subprocess.CompletedProcess:
    args = [*run_args(tmp, model), *extra]
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout_s, cwd=tmp, check=False
    )
