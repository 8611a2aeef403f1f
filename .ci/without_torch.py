"""The install without the `train` extra (run by .ci/run in a venv of its own): torch and
transformers are absent, `rlbus eval` evaluates a scripted OpenAI-compatible server on
127.0.0.1 end to end, `rlbus sql` reads what it stored, and `rlbus run` names the extra."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rlbus.launch.scripted_model import ScriptedModel, ScriptedServer

ROOT = Path(__file__).resolve().parent.parent


def rlbus(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    command = [sys.executable, "-m", "rlbus", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def main() -> None:
    present = [m for m in ("torch", "transformers") if importlib.util.find_spec(m)]
    assert not present, f"this venv should not have {present}"
    with tempfile.TemporaryDirectory() as work, ScriptedServer(ScriptedModel(model="m")) as server:
        url = server.url + "/v1"
        evaluated = rlbus(
            "eval", str(ROOT / "examples" / "reverse_text"), "--model", "m", "--base-url", url,
            "-n", "4", cwd=work,
        )  # fmt: skip
        assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
        counted = rlbus("sql", "SELECT count() FROM scored FINAL", "--format", "csv", cwd=work)
        assert counted.returncode == 0, counted.stderr
        assert counted.stdout.split()[-1] == "16", counted.stdout  # 4 tasks x group of 4
        refused = rlbus("run", str(ROOT / "examples" / "reverse_text" / "rl.toml"), cwd=work)
        assert refused.returncode == 2 and "rlbus[train]" in refused.stderr, refused.stderr
    print("without torch: rlbus eval stored 16 scored rollouts; rlbus run names the train extra")


if __name__ == "__main__":
    main()
