"""Rows from where tasks live: JSONL, Parquet, a Hugging Face dataset saved to disk, a
reasoning-gym generator (`reasoning-gym:NAME?size=100&seed=0`, procedural, nothing downloaded),
or a Python task set (`file.py:NAME` or `package.module:NAME`, an iterable or a function
returning one). Each row becomes a TaskPublished."""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import msgspec

from rlbus.schemas import TaskPublished, derived_id

TASK_FIELDS = {
    "task_id",
    "env",
    "prompt",
    "answer",
    "info",
    "group_size",
    "split",
    "run_id",
    "event_id",
}
ALIASES = {"question": "prompt", "task": "env", "id": "task_id"}
"""Column names verifiers-style data sets use, mapped to ours."""


class TaskSourceError(ValueError):
    """A task source that cannot be read or has rows that are not tasks."""


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskSourceError(f"{path}:{lineno}: not JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise TaskSourceError(
                    f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}"
                )
            yield row


def _parquet(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches():
        yield from batch.to_pylist()


def _hf_disk(path: Path) -> Iterator[dict[str, Any]]:
    try:
        from datasets import DatasetDict, load_from_disk
    except ImportError as exc:
        raise TaskSourceError(
            f"{path} is a Hugging Face dataset; install rlbus[data] to read it"
        ) from exc
    data = load_from_disk(str(path))
    if isinstance(data, DatasetDict):
        for split, part in data.items():
            for row in part:
                yield {"split": split, **row}
    else:
        yield from data


def _python(spec: str) -> Iterator[dict[str, Any] | TaskPublished]:
    target, _, name = spec.partition(":")
    if target.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location(Path(target).stem, target)
        if module_spec is None or module_spec.loader is None:
            raise TaskSourceError(f"cannot import {target}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    name = name or "tasks"
    if not hasattr(module, name):
        raise TaskSourceError(f"{target} has no {name!r} (give FILE.py:NAME or module:NAME)")
    obj = getattr(module, name)
    yield from obj() if callable(obj) else obj


REASONING_GYM = "reasoning-gym:"


def reasoning_gym(
    name: str, size: int = 1000, seed: int = 0, **config: Any
) -> Iterator[dict[str, Any]]:
    """Rows of a reasoning-gym data set: question, answer and the generator's metadata (which its
    `score_answer` needs) under info["metadata"]. Task ids follow from (name, seed, index)."""
    try:
        import reasoning_gym as rg
    except ImportError as exc:
        raise TaskSourceError(
            f"reasoning-gym:{name} needs the reasoning-gym package (pip install rlbus[data])"
        ) from exc
    try:
        data = rg.create_dataset(name, size=size, seed=seed, **config)
    except Exception as exc:
        raise TaskSourceError(f"reasoning-gym:{name}: {exc}") from exc
    for index, entry in enumerate(data):
        yield {
            "task_id": derived_id("reasoning-gym", name, seed, index),
            "prompt": entry["question"],
            "answer": str(entry["answer"]),
            "info": {"dataset": name, "metadata": entry["metadata"]},
        }


def _reasoning_gym_spec(source: str) -> Iterator[dict[str, Any]]:
    name, _, query = source[len(REASONING_GYM) :].partition("?")
    options: dict[str, Any] = {}
    for key, value in parse_qsl(query):
        options[key] = int(value) if value.lstrip("-").isdigit() else value
    return reasoning_gym(name, **options)


def read_rows(source: str) -> Iterator[dict[str, Any] | TaskPublished]:
    """Rows of a task source, chosen by what `source` names."""
    if source.startswith(REASONING_GYM):
        return _reasoning_gym_spec(source)
    path = Path(source)
    if source.endswith((".jsonl", ".json")):
        return _jsonl(path)
    if source.endswith(".parquet"):
        return _parquet(path)
    if path.is_dir() and any(
        (path / marker).exists() for marker in ("dataset_info.json", "dataset_dict.json")
    ):
        return _hf_disk(path)
    if ":" in source or source.endswith(".py"):
        return _python(source)
    raise TaskSourceError(
        f"cannot tell what {source!r} is: give a .jsonl/.parquet file, a Hugging Face dataset "
        "directory (save_to_disk), reasoning-gym:NAME, FILE.py:NAME or package.module:NAME"
    )


def to_task(
    row: dict[str, Any] | TaskPublished,
    env: str | None = None,
    run_id: str = "",
    *,
    replace_env: bool = False,
) -> TaskPublished:
    """A row as a TaskPublished: aliases mapped, other columns kept in `info`, and a task id
    derived from the content when the row has none (so republishing is idempotent).

    `env` names the environment of a row that has no `env` (or `task`) column; with
    `replace_env`, of every row (an environment's own task set runs under its configured id)."""
    if isinstance(row, TaskPublished):
        task = msgspec.structs.replace(row, env=env) if env and replace_env else row
    else:
        fields: dict[str, Any] = {}
        info: dict[str, Any] = dict(row.get("info") or {})
        for key, value in row.items():
            key = ALIASES.get(key, key)
            if key == "info":
                continue
            if key in TASK_FIELDS:
                fields[key] = value
            else:
                info[key] = value
        if env and (replace_env or "env" not in fields):
            fields["env"] = env
        if "env" not in fields:
            raise TaskSourceError(
                f"task row has no env (pass --env or add an 'env' column): {row!r:.200}"
            )
        if "prompt" not in fields:
            raise TaskSourceError(f"task row has no prompt/question: {row!r:.200}")
        fields.setdefault(
            "task_id",
            derived_id(
                fields["env"],
                json.dumps(fields["prompt"], sort_keys=True),
                fields.get("answer", ""),
            ),
        )
        fields["task_id"] = str(fields["task_id"])
        if not isinstance(fields.get("answer", ""), str):
            fields["answer"] = json.dumps(fields["answer"])
        task = TaskPublished(info=info, **fields)
    if run_id:
        task.run_id = run_id
    return task


def load_tasks(
    source: str | Iterable[dict[str, Any] | TaskPublished], env: str | None = None, run_id: str = ""
) -> Iterator[TaskPublished]:
    rows = read_rows(source) if isinstance(source, str) else source
    for row in rows:
        yield to_task(row, env=env, run_id=run_id)
