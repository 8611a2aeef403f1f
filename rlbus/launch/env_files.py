"""An environment's TOML for the env producers and judges of a run: the environment's own table
with the run's overrides and the train-mode model endpoint (those roles take an environment
spec, not a run config). Written to the run directory, so what each role ran is on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomli_w

from rlbus.config import deep_merge
from rlbus.config.orchestrator import EnvEntry
from rlbus.environment.loader import ENV_FILE, read_env_table


def env_file(
    entry: EnvEntry, name: str, base_dir: Path, out_dir: Path, model: str, urls: list[str]
) -> Path:
    """`urls`: the run's inference replicas (/v1 URLs), the first as model.base_url."""
    table = _env_table(entry.path, base_dir)
    model_cfg = {
        "name": Path(model).name,
        "base_url": urls[0],
        "replica_urls": urls[1:],
        "mode": "train",
        "tokenizer": str(Path(model).resolve()),
    }
    merged = deep_merge(deep_merge(table, entry.overrides), {"id": name, "model": model_cfg})
    out = out_dir / f"{name}.toml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(tomli_w.dumps({"env": merged}))
    return out


def _env_table(spec: str, base_dir: Path) -> dict[str, Any]:
    """The environment's own table: its TOML's (an env.toml or a directory holding one), or just
    the task set that module:Class or FILE.py[:Class] names; a relative task set file is made
    absolute, since the table is written elsewhere."""
    path = Path(spec) if Path(spec).is_absolute() else base_dir / spec
    if path.is_dir() or spec.endswith(".toml"):
        source = path / ENV_FILE if path.is_dir() else path
        table, relative_to = read_env_table(source), source.parent
    else:
        table, relative_to = {"taskset": spec}, base_dir
    taskset, _, attr = table["taskset"].partition(":")
    if taskset.endswith(".py") and not Path(taskset).is_absolute():
        table["taskset"] = str((relative_to / taskset).resolve()) + (f":{attr}" if attr else "")
    return table
