"""An environment's TOML for the env producers and judges of a run: the environment's own table
with the run's overrides and the train-mode model endpoint (those roles take an environment
spec, not a run config). Written to the run directory, so what each role ran is on disk."""

from __future__ import annotations

from pathlib import Path

import tomli_w

from rlbus.config import deep_merge
from rlbus.config.orchestrator import EnvEntry
from rlbus.producers.environment.loader import ENV_FILE, read_env_table


def env_file(
    entry: EnvEntry, name: str, base_dir: Path, out_dir: Path, model: str, urls: list[str]
) -> Path:
    """`urls`: the run's inference replicas (/v1 URLs), the first as model.base_url."""
    path = Path(entry.path) if Path(entry.path).is_absolute() else base_dir / entry.path
    source = path / ENV_FILE if path.is_dir() else path
    table = read_env_table(source)
    taskset, _, attr = table["taskset"].partition(":")
    if taskset.endswith(".py") and not Path(taskset).is_absolute():
        table["taskset"] = str((source.parent / taskset).resolve()) + (f":{attr}" if attr else "")
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
