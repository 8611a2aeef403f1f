"""Runtimes: programs in their own directory, with limits and a scrubbed environment; a run over
a limit ends with the reason; nothing is left behind."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from rlbus.producers.environment import RuntimeConfig
from rlbus.producers.runtimes import ExecResult, docker_problem, make_runtime


def run(
    config: RuntimeConfig, code: str, env: dict[str, str] | None = None
) -> tuple[ExecResult, Path]:
    async def main() -> tuple[ExecResult, Path]:
        async with make_runtime(config).sandbox("0123456789ab") as sandbox:
            (sandbox.workdir / "prog.py").write_text(code)
            return await sandbox.run([sys.executable, "prog.py"], env or {}), sandbox.workdir

    return asyncio.run(main())


def test_subprocess_scrubs_the_environment_and_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    code = "import os, json; open('out.txt', 'w').write('x'); print(json.dumps(dict(os.environ)))"
    result, workdir = run(
        RuntimeConfig(kind="subprocess"), code, {"OPENAI_BASE_URL": "http://127.0.0.1:1/v1"}
    )
    assert result.error_kind == "" and result.returncode == 0
    seen = __import__("json").loads(result.stdout)
    assert "SECRET_TOKEN" not in seen and seen["OPENAI_BASE_URL"] == "http://127.0.0.1:1/v1"
    assert seen["HOME"] == str(workdir) and set(seen) <= {
        "PATH",
        "LANG",
        "LC_ALL",
        "TZ",
        "HOME",
        "TMPDIR",
        "OPENAI_BASE_URL",
        "LC_CTYPE",
    }
    assert not workdir.exists()


def test_local_runtime_keeps_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VISIBLE_HERE", "yes")
    result, _ = run(RuntimeConfig(kind="local"), "import os; print(os.environ['VISIBLE_HERE'])")
    assert result.stdout.strip() == "yes"


def test_timeout_kills_the_whole_process_group() -> None:
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    result, _ = run(RuntimeConfig(kind="subprocess", timeout_s=1.0), code)
    assert time.monotonic() - started < 10
    assert result.error_kind == "timeout" and "1s time limit" in result.error
    grandchild = int(result.stdout.split()[0])
    time.sleep(0.2)
    assert not alive(grandchild)


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody has reaped yet (PID 1 here may not reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_memory_limit() -> None:
    result, _ = run(
        RuntimeConfig(kind="subprocess", memory_mb=200), "x = bytearray(1 << 30)\nprint('no limit')"
    )
    assert (
        result.error_kind == "memory"
        and "200 MiB" in result.error
        and "MemoryError" in result.error
    )


def test_cpu_limit() -> None:
    result, _ = run(RuntimeConfig(kind="subprocess", cpu_s=1, timeout_s=30), "while True: pass")
    assert result.error_kind == "cpu" and "1 CPU-second" in result.error


def test_nonzero_exit_carries_stderr() -> None:
    result, _ = run(RuntimeConfig(kind="subprocess"), "raise SystemExit('agent gave up')")
    assert (
        result.error_kind == "exit"
        and "exited with code 1" in result.error
        and "agent gave up" in result.error
    )


@pytest.mark.skipif(
    docker_problem() is not None, reason=f"docker runtime not testable here: {docker_problem()}"
)
def test_docker_runtime_runs_in_a_container() -> None:
    async def main() -> ExecResult:
        async with make_runtime(
            RuntimeConfig(kind="docker", image="python:3.11-slim", memory_mb=256)
        ).sandbox("d") as box:
            (box.workdir / "prog.py").write_text("import os; print(os.getcwd(), os.environ['X'])")
            return await box.run(["python", "prog.py"], {"X": "1"})

    result = asyncio.run(main())
    assert result.error_kind == "" and result.stdout.split() == ["/work", "1"]
