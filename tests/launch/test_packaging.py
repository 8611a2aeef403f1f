"""Packaging: every folder of the docs/architecture.md layout installs under `rlbus.` and
nothing else."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def test_every_sql_file_of_the_store_is_package_data() -> None:
    """Migrations and views are read from the installed package (importlib.resources): a .sql
    file the package-data globs miss is absent from a wheel and silently never applied."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    store = ROOT / tool["package-dir"]["rlbus.bus"] / "store"
    shipped = {p for glob in tool["package-data"]["rlbus.bus.store"] for p in store.glob(glob)}
    on_disk = set(store.rglob("*.sql"))
    assert on_disk and on_disk <= shipped, f"not in package-data: {sorted(on_disk - shipped)}"
