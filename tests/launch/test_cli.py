"""The CLI against the real broker and chdb: tasks publish from every source kind, topics,
sql while a sink holds the store (the README's quickstart: tests/launch/test_quickstart.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlbus.bus import EmbeddedBroker
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings, settings_variables
from rlbus.discovery import store_served_elsewhere
from rlbus.launch.processes import RoleProcess, alive

ROWS = [
    {"question": f"reverse {w}", "answer": w[::-1], "level": i}
    for i, w in enumerate(["abc", "hello", "rlbus"])
]


def rlbus(
    settings: Settings, *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return run_cli({**os.environ, **settings_variables(settings)}, *args, cwd=cwd, timeout=timeout)


def run_cli(
    env: dict[str, str], *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlbus", *args],
        env={**env, "COLUMNS": "200"},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_sources(tmp: Path) -> dict[str, str]:
    jsonl = tmp / "tasks.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    parquet = tmp / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    from datasets import Dataset

    hf = tmp / "hf"
    Dataset.from_list(ROWS).save_to_disk(str(hf))
    module = tmp / "my_tasks.py"
    module.write_text(
        "def tasks():\n    for r in ROWS:\n        yield dict(r)\n" + f"ROWS = {ROWS!r}\n"
    )
    return {
        "jsonl": str(jsonl),
        "parquet": str(parquet),
        "hf": str(hf),
        "python": f"{module}:tasks",
    }


def test_tasks_publish_every_source_then_sql_and_topics(settings: Settings, tmp_path: Path) -> None:
    sources = write_sources(tmp_path)
    sink = RoleProcess("sink", settings, tmp_path / "logs")
    try:
        wait_for(lambda: store_served_elsewhere(settings), 60, "the sink", check=alive(sink))
        for name, source in sources.items():
            result = rlbus(
                settings, "tasks", "publish", source, "--env", f"env-{name}", "--run-id", "cli-run"
            )
            assert result.returncode == 0, result.stderr
            assert "published 3 tasks" in result.stdout
        query = (
            "SELECT env, count() AS n, groupArray(answer) AS answers FROM tasks FINAL "
            "WHERE run_id = 'cli-run' GROUP BY env ORDER BY env"
        )

        def landed() -> bool:
            out = rlbus(settings, "sql", query, "--format", "json")
            return out.returncode == 0 and len(out.stdout.splitlines()) == 4

        wait_for(landed, 60, "tasks from every source", interval_s=0.5, check=alive(sink))
        rows = [
            json.loads(line)
            for line in rlbus(settings, "sql", query, "--format", "json").stdout.splitlines()
        ]
        assert [r["env"] for r in rows] == [f"env-{n}" for n in sorted(sources)]
        assert all(
            r["n"] == 3 and sorted(r["answers"]) == sorted(x["answer"] for x in ROWS) for r in rows
        )
        # Extra columns are kept in `info`; question became the prompt.
        csv = rlbus(
            settings,
            "sql",
            "SELECT JSONExtractString(prompt) AS prompt, JSONExtractInt(info, 'level') AS level "
            "FROM tasks FINAL "
            "WHERE env = 'env-jsonl' ORDER BY level",
            "--format",
            "csv",
        ).stdout.splitlines()
        assert csv == [
            '"prompt","level"',
            '"reverse abc",0',
            '"reverse hello",1',
            '"reverse rlbus",2',
        ]
        table = rlbus(settings, "sql", "SELECT count() AS tasks FROM tasks FINAL").stdout
        assert "12" in table and "tasks" in table
        refused = rlbus(settings, "sql", "DROP TABLE tasks")
        assert refused.returncode == 2 and "DROP" in refused.stderr

        topics = rlbus(settings, "topics")
        assert topics.returncode == 0, topics.stderr
        lines = topics.stdout.splitlines()
        tasks_row = next(line for line in lines if f"{settings.kafka.topic_prefix}tasks " in line)
        assert tasks_row.split("│")[2].strip() == str(settings.kafka.partitions)
        sink_row = next(
            line
            for line in lines
            if f"{settings.kafka.topic_prefix}sink " in line and " tasks " in line
        )
        committed, lag = (cell.strip() for cell in sink_row.split("│")[3:5])
        assert (committed, lag) == ("12", "0")  # the sink has stored and committed every task
    finally:
        sink.stop()


def test_bad_source_and_missing_broker_are_explained(settings: Settings, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\nnot json\n')
    result = rlbus(settings, "tasks", "publish", str(bad), "--env", "e")
    assert result.returncode == 2 and "bad.jsonl:2: not JSON" in result.stderr
    no_broker = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"bootstrap_servers": None})}
    )
    result = rlbus(no_broker, "topics", cwd=tmp_path)
    assert result.returncode != 0 and "rlbus broker" in result.stderr


@pytest.mark.slow
def test_broker_command_is_found_by_other_commands(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLBUS_")}
    broker = subprocess.Popen(
        [sys.executable, "-m", "rlbus", "broker"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = ""
        deadline = time.monotonic() + 30
        while "bootstrap servers" not in line and time.monotonic() < deadline:
            line = broker.stdout.readline()  # type: ignore[union-attr]
        address = line.rsplit(" ", 1)[-1].strip()
        assert address.startswith("127.0.0.1:")
        topics = run_cli(env, "topics", cwd=tmp_path, timeout=60)
        assert topics.returncode == 0, topics.stderr
        assert f"topics on {address}" in topics.stdout
    finally:
        broker.terminate()
        broker.wait(10)


def test_embedded_broker_reports_a_binary_that_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "tansu"
    fake.write_text("#!/bin/sh\necho 'cannot start: boom' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CALF_TANSU_BIN", str(fake))
    from rlbus.bus import BrokerError

    with pytest.raises(BrokerError, match="exited with code 3"):
        EmbeddedBroker(log_path=tmp_path / "log").start(timeout_s=5)


@pytest.mark.slow
def test_the_cli_imports_no_model_library() -> None:
    # Every role process runs `python -m rlbus worker ...`: torch and transformers there cost
    # each of them seconds before doing anything (the CLI took 6.3 s to import with them).
    code = (
        "import sys, rlbus.cli; print(sorted({'torch', 'transformers', 'vllm'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_worker_inference_alone_starts_a_broker_and_withdraws_it(tmp_path: Path) -> None:
    """`rlbus worker inference` with no broker configured or announced starts one, announces it
    for the next commands, and stops it (announcement withdrawn) when it stops."""
    from rlbus.bus import free_port
    from rlbus.consumers.inference.model_init import init_model
    from rlbus.discovery import BROKER_FILE, reachable

    init_model(tmp_path / "tiny")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLBUS_")}
    port = free_port()
    worker = subprocess.Popen(
        [sys.executable, "-m", "rlbus", "worker", "inference", "--model", "tiny"]
        + ["--port", str(port), "--threads", "1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    announcement = tmp_path / "rlbus-data" / BROKER_FILE
    try:

        def running() -> None:
            assert worker.poll() is None, worker.communicate()[0]

        wait_for(
            lambda: reachable(f"127.0.0.1:{port}"),
            timeout_s=120,
            what="the inference server",
            check=running,
        )
        address, pid = announcement.read_text().split()
        assert int(pid) == worker.pid and reachable(address)
        topics = run_cli(env, "topics", cwd=tmp_path, timeout=60)
        assert topics.returncode == 0 and f"topics on {address}" in topics.stdout, topics.stderr
    finally:
        worker.terminate()
        out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    assert not announcement.exists() and not reachable(address)
