"""Packaging: every folder of the docs/architecture.md layout installs under `rlbus.` and
nothing else."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_under_the_rlbus_namespace() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir: dict[str, str] = tool["package-dir"]
    listed = set(tool["packages"])
    assert all(name == "rlbus" or name.startswith("rlbus.") for name in listed)
    on_disk = set()
    for name, folder in package_dir.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            on_disk.add(".".join([name, *relative.parts]))
    assert on_disk == listed, (
        f"missing from pyproject: {on_disk - listed}; listed but absent: {listed - on_disk}"
    )
