"""Rows from where tasks live: JSONL (a file, or `-` for standard input), Parquet, a Hugging
Face dataset by hub id (`hf:ORG/NAME`, through `datasets.load_dataset`: downloaded once, then
from its cache) or saved to disk, a reasoning-gym generator (`reasoning-gym:NAME?size=100&seed=0`,
procedural, nothing downloaded), or a Python task set (`file.py:NAME` or `package.module:NAME`,
an iterable or a function returning one). Each row becomes a TaskPublished."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
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


def _json_lines(lines: Iterable[str], where: str) -> Iterator[dict[str, Any]]:
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskSourceError(f"{where}:{lineno}: not JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise TaskSourceError(
                f"{where}:{lineno}: expected a JSON object, got {type(row).__name__}"
            )
        yield row


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as f:
        yield from _json_lines(f, str(path))


def _parquet(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches():
        yield from batch.to_pylist()


def _datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise TaskSourceError(f"{what} is a Hugging Face dataset; install rlbus[data]") from exc
    return datasets


def _rows_of(data: Any, split: str | None) -> Iterator[dict[str, Any]]:
    """A Dataset's rows, or every split's rows of a DatasetDict, each with its split."""
    if split is not None:
        name = split.split("[")[0]  # "train[:100]" is a slice of train
        yield from ({"split": name, **row} for row in data)
        return
    if isinstance(data, dict):
        for name, part in data.items():
            yield from ({"split": name, **row} for row in part)
    else:
        yield from data


def _hf_disk(path: Path, split: str | None) -> Iterator[dict[str, Any]]:
    data = _datasets(str(path)).load_from_disk(str(path))
    if split is not None:
        if not isinstance(data, dict) or split not in data:
            splits = sorted(data) if isinstance(data, dict) else "one unnamed split"
            raise TaskSourceError(f"{path} has no split {split!r} (it has {splits})")
        data = data[split]
    yield from _rows_of(data, split)


def hf_hub(name: str, subset: str | None = None, split: str | None = None) -> Iterator[dict]:
    """Rows of a Hugging Face Hub dataset (`subset`: its config name). Loaded by
    datasets.load_dataset, so a dataset downloaded once is read from the cache after, and with
    HF_HUB_OFFLINE=1 without asking the hub."""
    datasets = _datasets(f"hf:{name}")
    try:
        data = datasets.load_dataset(name, subset, split=split)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TaskSourceError(f"hf:{name}: cannot load it: {first}") from exc
    yield from _rows_of(data, split)


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
    rows = obj() if callable(obj) else obj
    if not isinstance(rows, Iterable):
        raise TaskSourceError(f"{target}:{name} is a {type(rows).__name__}, not rows of tasks")
    yield from rows


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


HF = "hf:"
STDIN = "-"


def read_rows(
    source: str, *, subset: str | None = None, split: str | None = None
) -> Iterator[dict[str, Any] | TaskPublished]:
    """Rows of a task source, chosen by what `source` names; `subset` and `split` choose part of
    a Hugging Face dataset."""
    if source.startswith(HF):
        return hf_hub(source[len(HF) :], subset, split)
    path = Path(source)
    is_saved = path.is_dir() and any(
        (path / marker).exists() for marker in ("dataset_info.json", "dataset_dict.json")
    )
    if subset or (split and not is_saved):
        option = "--subset" if subset else "--split"
        raise TaskSourceError(f"{option} chooses part of a Hugging Face dataset, not of {source}")
    if is_saved:
        return _hf_disk(path, split)
    if source == STDIN:
        return _json_lines(sys.stdin, "<stdin>")
    if source.startswith(REASONING_GYM):
        return _reasoning_gym_spec(source)
    if source.endswith((".jsonl", ".json")):
        return _jsonl(path)
    if source.endswith(".parquet"):
        return _parquet(path)
    if ":" in source or source.endswith(".py"):
        return _python(source)
    raise TaskSourceError(
        f"cannot tell what {source!r} is: give a .jsonl/.parquet file, - (JSONL on standard "
        "input), hf:ORG/NAME (a Hugging Face Hub dataset), a dataset directory (save_to_disk), "
        "reasoning-gym:NAME, FILE.py:NAME or package.module:NAME"
    )


def renamed(
    rows: Iterable[dict[str, Any] | TaskPublished], columns: dict[str, str]
) -> Iterator[dict[str, Any] | TaskPublished]:
    """Rows with columns renamed (`{"question": "prompt"}`); a column to rename that the first
    row lacks is an error naming the columns it has."""
    checked = False
    for row in rows:
        if isinstance(row, TaskPublished) or not columns:
            yield row
            continue
        if not checked and (missing := sorted(set(columns) - set(row))):
            raise TaskSourceError(
                f"--map {', '.join(missing)}: no such column (the rows have {sorted(row)})"
            )
        checked = True
        yield {columns.get(k, k): v for k, v in row.items()}


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
    source: str | Iterable[dict[str, Any] | TaskPublished],
    env: str | None = None,
    run_id: str = "",
    *,
    columns: dict[str, str] | None = None,
    subset: str | None = None,
    split: str | None = None,
) -> Iterator[TaskPublished]:
    """Tasks from a source (see read_rows) or rows; `columns` renames columns first."""
    rows = read_rows(source, subset=subset, split=split) if isinstance(source, str) else source
    for row in renamed(rows, columns or {}):
        yield to_task(row, env=env, run_id=run_id)
