"""The map stays true: who may import whom (docs/architecture.md's layout and the contracts
below the roles),
read from the source with `ast`, lazy imports and TYPE_CHECKING imports included (a dependency
is a dependency, wherever its import statement sits)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "rlbus": "rlbus",
    "schemas": "rlbus.schemas",
    "bus": "rlbus.bus",
    "clients": "rlbus.clients",
    "environment": "rlbus.environment",
    "producers": "rlbus.producers",
    "consumers": "rlbus.consumers",
}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [FOLDERS[rel.parts[0]], *rel.with_suffix("").parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


SHARED_BY_CONSUMERS = {"heartbeat", "model_size"}
"""Modules of consumers/ itself, shared by the roles below them (not a role each): re-announcing
what a role serves, and a model's sizes and memory read before it is loaded."""


def area(module: str) -> str:
    """The part of the layout a module belongs to."""
    parts = module.split(".")
    second = parts[1] if len(parts) > 1 else ""
    if second in ("schemas", "config", "clients", "bus", "console", "ui"):
        return second
    if second in ("cli", "commands"):
        return "cli"
    if second in ("launch", "discovery"):
        return "launcher"
    if second == "environment":
        # Task sources (files, data sets, generators) lie below the environment definition
        # that draws its tasks from them.
        return "task_sources" if parts[2:3] == ["task_sources"] else "environment"
    if second == "producers":
        return "producers"
    if second == "consumers":
        shared = len(parts) == 3 and parts[2] in SHARED_BY_CONSUMERS
        return "consumers" if shared else f"consumers.{parts[2]}"
    return module


def imports() -> dict[str, set[str]]:
    """Module -> the rlbus modules it imports (absolute names, every import statement)."""
    found: dict[str, set[str]] = defaultdict(set)
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            module = module_name(path)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                else:
                    continue
                found[module].update(n for n in names if n == "rlbus" or n.startswith("rlbus."))
    return found


ALLOWED: dict[str, set[str]] = {
    "schemas": {"schemas"},
    "config": {"config", "schemas"},
    "clients": {"clients", "config", "schemas"},
    "bus": {"bus", "config", "schemas"},
    "task_sources": {"task_sources", "bus", "config", "schemas"},
    "environment": {"environment", "task_sources", "bus", "clients", "config", "schemas"},
}
"""The contracts below the roles (the environment contract included) import only what lies
below them."""


def test_contracts_import_nothing_above_them() -> None:
    wrong = [
        (module, target)
        for module, targets in imports().items()
        if area(module) in ALLOWED
        for target in targets
        if area(target) not in ALLOWED[area(module)]
    ]
    assert not wrong, f"imports from a lower layer into a higher one: {wrong}"


def test_roles_import_neither_the_cli_nor_the_launcher_nor_each_other() -> None:
    wrong = []
    for module, targets in imports().items():
        here = area(module)
        if not here.startswith(("producers", "consumers")):
            continue
        for target in targets:
            there = area(target)
            if there in ("cli", "launcher"):
                wrong.append((module, target, "roles never import the CLI or the launcher"))
            elif here == "producers" and there.startswith("consumers"):
                wrong.append((module, target, "producers never import consumers"))
            elif here.startswith("consumers") and there == "producers":
                wrong.append((module, target, "consumers share only the environment contract"))
            elif here.startswith("consumers.") and there.startswith("consumers.") and there != here:
                wrong.append((module, target, "a role never imports another role"))
    assert not wrong, "\n".join(map(str, wrong))


def test_no_import_circle_between_areas() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, targets in imports().items():
        for target in targets:
            if area(target) != area(module):
                graph[area(module)].add(area(target))
    circles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in graph.get(node, ()):
            if nxt in path:
                circles.append([*path[path.index(nxt) :], nxt])
            elif len(path) < 12:
                visit(nxt, [*path, nxt])

    for start in list(graph):
        visit(start, [start])
    assert not circles, f"import circles: {circles[:5]}"


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("rlbus.schemas.samples", "schemas"),
        ("rlbus.environment.scoring", "environment"),
        ("rlbus.environment.task_sources.sources", "task_sources"),
        ("rlbus.producers.rollouts", "producers"),
        ("rlbus.consumers.judge.role", "consumers.judge"),
        ("rlbus.consumers.heartbeat", "consumers"),
        ("rlbus.consumers.model_size", "consumers"),
        ("rlbus.bus.heap", "bus"),
        ("rlbus.commands.worker", "cli"),
        ("rlbus.launch.supervisor", "launcher"),
        ("rlbus.launch.scripted_model", "launcher"),
    ],
)
def test_areas_are_what_the_rules_think(module: str, expected: str) -> None:
    assert area(module) == expected


SHARED_NAMES: dict[str, str] = {
    "__init__.py": "a package",
    "role.py": "a role's door (rlbus.bus.role.Role): consumers/<role>/role.py, producers/role.py",
    "server.py": "the HTTP server of its package (inference, interception, ui)",
    "base.py": "the protocol its package's implementations follow (harnesses, runtimes)",
}
"""Base names more than one module may have, each with the one meaning it has everywhere."""


def test_no_two_modules_share_a_base_name_unless_listed() -> None:
    """One meaning per module name. A command module (`rlbus/commands/NAME.py`, named after its
    command) may share its name with the one module that does the command's work, and a read
    model (`bus/store/reads/NAME.py`, the SQL a reader runs) with the modules that import it."""
    by_name: dict[str, list[Path]] = defaultdict(list)
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            by_name[path.name].append(path.relative_to(ROOT))
    found = imports()
    clashes = {}
    for name, paths in by_name.items():
        if len(paths) < 2 or name in SHARED_NAMES:
            continue
        paths = [
            p
            for p in paths
            if p.parts[:3] != ("bus", "store", "reads")
            or not any(module_name(ROOT / p) in found[module_name(ROOT / q)] for q in paths)
        ]
        if len(paths) < 2:
            continue
        others = [p for p in paths if p.parts[:2] != ("rlbus", "commands")]
        if len(paths) - len(others) == 1 and len(others) == 1:
            continue
        clashes[name] = [str(p) for p in paths]
    assert not clashes, f"modules sharing a base name (rename one, or list it): {clashes}"
