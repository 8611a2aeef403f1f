"""`rlbus tasks publish` from a Hugging Face dataset by hub id (read from the datasets cache, as
a download leaves it, with no network), from standard input, with columns renamed; what could
not be read is one line naming it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlbus.bus import Bus
from rlbus.bus.topic_reader import read_back
from rlbus.config import Settings, settings_variables
from rlbus.schemas import TaskPublished

ROWS = {
    "train": [{"problem": f"add {i} and 1", "solution": str(i + 1), "level": i} for i in range(5)],
    "test": [{"problem": "add 9 and 1", "solution": "10", "level": 9}],
}


@pytest.fixture
def hf_home(tmp_path: Path) -> Path:
    """A Hugging Face cache holding `acme/arith` (configs "easy" and "hard") as load_dataset
    leaves a hub dataset it downloaded: prepared by the same Parquet builder, under the repo id."""
    from datasets.packaged_modules.parquet.parquet import Parquet

    home = tmp_path / "hf"
    files = {}
    for split, rows in ROWS.items():
        files[split] = str(tmp_path / f"{split}.parquet")
        pq.write_table(pa.Table.from_pylist(rows), files[split])
    for config in ("easy", "hard"):
        Parquet(
            cache_dir=str(home / "datasets"),
            data_files=files,
            dataset_name="arith",
            repo_id="acme/arith",
            config_name=config,
            config_id=config,
            hash="0" * 16,
        ).download_and_prepare()
    return home


def publish(settings: Settings, *args: str, stdin: str = "", hf_home: Path | None = None):
    env = {**os.environ, **settings_variables(settings), "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    if hf_home is not None:
        env["HF_HOME"] = str(hf_home)
    return subprocess.run(
        [sys.executable, "-m", "rlbus", "tasks", "publish", *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def published(settings: Settings, run_id: str) -> list[TaskPublished]:
    async def read() -> list[TaskPublished]:
        async with Bus.of(settings) as bus:
            return [e for e in await read_back(bus, "tasks", run_id)]  # type: ignore[misc]

    return sorted(asyncio.run(read()), key=lambda t: t.info["level"])


def test_a_hub_dataset_by_id_from_the_cache_with_columns_mapped(
    settings: Settings, hf_home: Path
) -> None:
    mapped = ["--map", "problem=prompt", "--map", "solution=answer"]
    out = publish(
        settings,
        "hf:acme/arith",
        "--subset",
        "hard",
        "--split",
        "train",
        "--limit",
        "3",
        "--env",
        "arith",
        "--run-id",
        "hub",
        *mapped,
        hf_home=hf_home,
    )
    assert out.returncode == 0, out.stderr
    assert "published 3 tasks" in out.stdout
    tasks = published(settings, "hub")
    assert [(t.env, t.prompt, t.answer, t.split) for t in tasks] == [
        ("arith", f"add {i} and 1", str(i + 1), "train") for i in range(3)
    ]
    assert [t.info for t in tasks] == [{"level": i} for i in range(3)]
    every = publish(settings, "hf:acme/arith", "--subset", "easy", "--env", "arith", *mapped)
    assert every.returncode == 2 and "hf:acme/arith: cannot load it" in every.stderr  # no cache
    every = publish(
        settings,
        "hf:acme/arith",
        "--subset",
        "easy",
        "--env",
        "a",
        "--run-id",
        "all",
        *mapped,
        hf_home=hf_home,
    )
    assert every.returncode == 0, every.stderr
    assert sorted(t.split for t in published(settings, "all")) == ["test"] + ["train"] * 5


def test_an_unreachable_dataset_or_column_is_one_line_naming_it(
    settings: Settings, hf_home: Path
) -> None:
    out = publish(settings, "hf:nobody/nothing", "--env", "e", hf_home=hf_home)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("hf:nobody/nothing: ")
    wrong = publish(
        settings, "hf:acme/arith", "--subset", "hard", "--map", "question=prompt", hf_home=hf_home
    )
    assert wrong.returncode == 2
    assert "--map question: no such column (the rows have ['level', 'problem', 'solution'" in (
        wrong.stderr.replace("\n", "")
    )
    subset_of_a_file = publish(settings, "tasks.jsonl", "--subset", "x")
    assert "--subset chooses part of a Hugging Face dataset" in subset_of_a_file.stderr


def test_jsonl_from_standard_input(settings: Settings) -> None:
    lines = "".join(
        json.dumps({"question": f"q{i}", "answer": f"a{i}", "level": i}) + "\n" for i in range(4)
    )
    out = publish(settings, "-", "--env", "piped", "--run-id", "stdin", stdin=lines + "\n")
    assert out.returncode == 0, out.stderr
    assert "published 4 tasks" in out.stdout
    tasks = published(settings, "stdin")
    assert [(t.env, t.prompt, t.answer) for t in tasks] == [
        ("piped", f"q{i}", f"a{i}") for i in range(4)
    ]
    bad = publish(settings, "-", "--env", "piped", stdin='{"question": "q"}\n[1, 2]\n')
    assert bad.returncode == 2 and "<stdin>:2: expected a JSON object, got list" in bad.stderr
