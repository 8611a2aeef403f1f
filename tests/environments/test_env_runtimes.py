"""Runtimes: programs in their own directory, with limits and a scrubbed environment; a run over
a limit ends with the reason; nothing is left behind."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

import pytest
from support import ScriptedServer
from support.pids import alive

from rlbus.bus import free_port
from rlbus.environment import ModelConfig, RuntimeConfig
from rlbus.producers.interception import EvalBackend, InterceptionServer
from rlbus.producers.runtimes import (
    DockerRuntime,
    ExecResult,
    Runtime,
    docker_problem,
    make_runtime,
    sandbox_problem,
    tree,
)
from rlbus.producers.runtimes.docker import RELAY


def run(
    config: RuntimeConfig, code: str, env: dict[str, str] | None = None
) -> tuple[ExecResult, Path]:
    async def main() -> tuple[ExecResult, Path]:
        async with make_runtime(config).sandbox("0123456789ab") as sandbox:
            (sandbox.workdir / "prog.py").write_text(code)
            return await sandbox.run([sys.executable, "prog.py"], env or {}), sandbox.workdir

    return asyncio.run(main())


def test_subprocess_scrubs_the_variables_and_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    code = "import os, json; open('out.txt', 'w').write('x'); print(json.dumps(dict(os.environ)))"
    result, workdir = run(
        RuntimeConfig(kind="subprocess"), code, {"OPENAI_BASE_URL": "http://127.0.0.1:1/v1"}
    )
    assert result.error_kind == "" and result.returncode == 0
    seen = json.loads(result.stdout)
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


def test_local_runtime_keeps_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VISIBLE_HERE", "yes")
    result, _ = run(RuntimeConfig(kind="local"), "import os; print(os.environ['VISIBLE_HERE'])")
    assert result.stdout.strip() == "yes"


def test_timeout_kills_the_whole_process_group() -> None:
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
        "print('woke', flush=True)\n"
    )
    result, _ = run(RuntimeConfig(kind="subprocess", timeout_s=1.0), code)
    assert result.error_kind == "timeout" and "1s time limit" in result.error
    assert "woke" not in result.stdout and result.duration_s >= 1.0  # killed, not waited for
    grandchild = int(result.stdout.split()[0])
    time.sleep(0.2)
    assert not alive(grandchild)


def test_memory_limit_holds_for_the_tree_and_leaves_no_cgroup() -> None:
    result, _ = run(
        RuntimeConfig(kind="subprocess", memory_mb=200), "x = bytearray(1 << 30)\nprint('no limit')"
    )
    assert result.error_kind == "memory" and "200 MiB memory limit" in result.error
    host = tree.cgroup_host()
    if host is not None:  # where cgroups are made, the kernel kept the tree at the limit
        assert "whole process tree" in result.error and f"cgroup v{host.version}" in result.error
        assert result.peak_mb is not None and result.peak_mb <= 200
        assert not [p for d in host.parents.values() for p in d.glob(f"rlbus-{os.getpid()}-*")]


HOG = """
import subprocess, sys
hold = "x = bytearray(100 << 20); print('held', flush=True); import time; time.sleep(10)"
children = [subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE)
            for _ in range(4)]
print([c.stdout.readline() for c in children], flush=True)
import time; time.sleep(10)
"""


@pytest.mark.parametrize("kind", ["subprocess", "sandbox"])
@pytest.mark.slow
def test_without_cgroups_a_watchdog_kills_the_tree_over_its_memory(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Four children of 100 MiB each (each under the per-process limit) under a 250 MiB limit."""
    if kind == "sandbox" and sandbox_problem() is not None:
        pytest.skip(f"no sandbox here: {sandbox_problem()}")
    monkeypatch.setattr(tree, "cgroup_host", lambda: None)  # a host without writable cgroups
    result, _ = run(RuntimeConfig(kind=kind, memory_mb=250, timeout_s=30), HOG)
    assert result.error_kind == "memory" and "held by watchdog" in result.error, result.error
    assert result.peak_mb is not None and result.peak_mb > 250
    print(f"{kind}: watchdog saw the tree peak at {result.peak_mb:.0f} MiB (limit 250 MiB)")


@pytest.mark.slow
def test_without_cgroups_the_subprocess_tree_is_killed_at_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The subreaper keeps a setsid grandchild findable while the program lives."""
    monkeypatch.setattr(tree, "cgroup_host", lambda: None)
    code = """
import subprocess, sys, time
sleeper = "import time; time.sleep(60)"
inner = (
    "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', %r], "
    "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
    % sleeper
)
done = subprocess.run([sys.executable, "-c", inner], capture_output=True, text=True)
print(done.stdout, done.stderr, flush=True)
time.sleep(60)
"""
    result, _ = run(RuntimeConfig(kind="subprocess", timeout_s=2), code)
    assert result.error_kind == "timeout"
    assert result.stdout.split(), result
    orphan = int(result.stdout.split()[0])  # its parent exited: it was re-parented
    time.sleep(0.2)
    assert not alive(orphan)


async def twice(runtime: Runtime, code: str) -> list[str]:
    """Run `code` in two rollouts of one runtime; their stdout."""
    outputs = []
    for rollout in ("first", "second"):
        async with runtime.sandbox(rollout) as sandbox:
            (sandbox.workdir / "prog.py").write_text(code)
            result = await sandbox.run([sys.executable, "prog.py"], {})
            outputs.append(result.stdout.strip())
    return outputs


def test_auto_falls_back_to_subprocess_when_bubblewrap_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox_problem.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="bubblewrap is not installed"):
            make_runtime(RuntimeConfig(kind="sandbox"))  # asked for by name: no fallback
        with caplog.at_level(logging.WARNING):
            outputs = asyncio.run(twice(make_runtime(RuntimeConfig()), "print('ran')"))
    finally:
        sandbox_problem.cache_clear()
    assert outputs == ["ran", "ran"]
    (line,) = [r.getMessage() for r in caplog.records if "runtime auto" in r.getMessage()]
    assert "bubblewrap is not installed" in line and "subprocess runtime" in line


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


needs_sandbox = pytest.mark.skipif(
    sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
)


@needs_sandbox
def test_sandbox_shows_the_program_only_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    code = """
import json, os, socket
def readable(path):
    try:
        open(path, "rb").close() if os.path.isfile(path) else os.listdir(path)
        return True
    except OSError:
        return False
try:
    socket.create_connection(("127.0.0.1", 22), timeout=1)
    network = "reached"
except OSError as exc:
    network = type(exc).__name__
open("out.txt", "w").write("x")
print(json.dumps({
    "env": sorted(os.environ), "cwd": os.getcwd(), "uid": os.getuid(),
    "caps": [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1],
    "shadow": readable("/etc/shadow"), "repository": readable(os.environ["REPO"]),
    "network": network,
}))
"""
    repository = Path(__file__).resolve().parents[2] / "pyproject.toml"
    result, workdir = run(RuntimeConfig(kind="sandbox"), code, {"REPO": str(repository)})
    assert result.error_kind == "", result.error
    seen = json.loads(result.stdout)
    assert "SECRET_TOKEN" not in seen["env"] and seen["cwd"] == str(workdir)
    assert seen["caps"] == "0000000000000000"
    assert not seen["shadow"] and not seen["repository"], seen
    assert seen["network"] == "ConnectionRefusedError"  # nothing listens in its own namespace
    assert not workdir.exists()


@needs_sandbox
def test_sandbox_timeout_kills_everything_in_it() -> None:
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', 'rlbus-sb-marker'],"
        " start_new_session=True)\n"
        "time.sleep(60)\n"
        "print('woke', flush=True)\n"
    )
    result, _ = run(RuntimeConfig(kind="sandbox", timeout_s=1.0), code)
    assert result.error_kind == "timeout" and "woke" not in result.stdout
    time.sleep(0.2)
    leftovers = [
        p.name
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and b"rlbus-sb-marker" in _cmdline(p) and alive(int(p.name))
    ]
    assert leftovers == []


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_docker_command_has_the_limits_and_no_network(tmp_path: Path) -> None:
    """No Docker engine here: the `docker run` argv is checked, not run."""
    runtime = make_runtime(
        RuntimeConfig(kind="docker", memory_mb=256, cpus=1.5, cpu_s=30, pids_max=64)
    )
    assert isinstance(runtime, DockerRuntime)
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:4242/r/SECRET-TOKEN/v1", "HOME": str(tmp_path)}
    argv, client_env = runtime.command("rlbus-x", tmp_path, ["python", "agent.py"], env, 4242)
    line = " ".join(argv)
    for expected in (
        "--network none",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        "--read-only --tmpfs /tmp",
        "--memory 256m --memory-swap 256m",
        "--pids-limit 64",
        "--cpus 1.5",
        "--ulimit cpu=30:31",
        f"-v {tmp_path}:{tmp_path} -w {tmp_path}",
        f"python:3.11-slim python /rlbus/relay.py 4242 {tmp_path}/.rlbus-model.sock -- "
        "python agent.py",
    ):
        assert expected in line, expected
    assert "SECRET-TOKEN" not in line and "-e OPENAI_BASE_URL" in line  # by name only
    assert client_env["OPENAI_BASE_URL"] == env["OPENAI_BASE_URL"]
    assert f"HOME={tmp_path}" in argv  # the client keeps its own HOME
    without, _ = runtime.command("rlbus-y", tmp_path, ["python", "agent.py"], env, None)
    assert "relay.py" not in " ".join(without) and "--network" in without


async def test_relay_serves_the_rollouts_url_from_a_unix_socket(tmp_path: Path) -> None:
    """The docker runtime's way in, without docker: relay.py (as the container would run it)
    passes 127.0.0.1:PORT to the rollout's unix socket on the real interception server."""
    with ScriptedServer() as upstream:
        backend = EvalBackend(ModelConfig(name="scripted", base_url=f"{upstream.url}/v1"))
        async with InterceptionServer(backend) as server:
            with server.session("rollout") as session:
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(str(tmp_path / "model.sock"))
                listener.listen()
                port = free_port()
                program = (
                    "import json, urllib.request\n"
                    f"url = 'http://127.0.0.1:{port}/r/{session.token}/v1/chat/completions'\n"
                    "body = {'model': 'm', 'messages': [{'role': 'user', 'content': "
                    "'Reverse the text: ab'}]}\n"
                    "request = urllib.request.Request(url, data=json.dumps(body).encode(), "
                    "headers={'Content-Type': 'application/json'})\n"
                    "for attempt in range(50):\n"
                    "    try:\n"
                    "        print(json.load(urllib.request.urlopen(request))['choices'][0]"
                    "['message']['content']); break\n"
                    "    except OSError:\n"
                    "        __import__('time').sleep(0.1)\n"
                )
                async with session.serving(listener):
                    proc = await asyncio.create_subprocess_exec(
                        sys.executable,
                        str(RELAY),
                        str(port),
                        str(tmp_path / "model.sock"),
                        "--",
                        sys.executable,
                        "-c",
                        program,
                        stdout=asyncio.subprocess.PIPE,
                    )
                    out, _ = await asyncio.wait_for(proc.communicate(), 30)
                listener.close()
                assert proc.returncode == 0 and out.decode().strip() == "ba"
                assert len(session.trace.completion()) == 1
