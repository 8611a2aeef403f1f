"""A role's exit as `rlbus run` reports it: a role killed by SIGKILL (what the kernel's OOM
killer sends) is named as likely out of memory, with the setting to lower."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from rlbus.config import Settings
from rlbus.consumers.inference.model_init import init_model
from rlbus.launch.processes import RoleProcess

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text" / "rl.toml"


def test_a_trainer_killed_by_sigkill_is_reported_as_likely_out_of_memory(
    settings: Settings, tmp_path: Path
) -> None:
    init_model(tmp_path / "tiny", seed=0)
    args = ["--config", str(EXAMPLE), "--model", str(tmp_path / "tiny")]
    trainer = RoleProcess("trainer", settings, tmp_path / "logs", args)
    os.kill(trainer.proc.pid, signal.SIGKILL)
    trainer.proc.wait()
    with pytest.raises(RuntimeError) as failure:
        trainer.check()
    message = str(failure.value)
    assert message.startswith("trainer was killed (SIGKILL, likely out of memory)")
    assert "trainer.micro_batch_tokens" in message and "code -9" not in message


def test_other_exits_keep_their_code(settings: Settings, tmp_path: Path) -> None:
    trainer = RoleProcess("trainer", settings, tmp_path / "logs", ["--no-such-option"])
    trainer.proc.wait()
    with pytest.raises(RuntimeError, match="trainer exited with code 2"):
        trainer.check()
