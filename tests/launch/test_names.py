"""One meaning per name: a public class or function defined at the top level of two modules of the
package is two things under one name (a reader, an import or a grep takes one for the other),
unless the name is listed below with the one meaning it has everywhere. Read from the source with
`ast`, as test_layout reads the imports."""

from __future__ import annotations

import ast
from collections import defaultdict

from test_layout import FOLDERS, ROOT, module_name

ALLOWED: dict[str, str] = {
    "register": "a command module's hook (`rlbus/commands/NAME.py`): how cli.py adds its commands",
    "main": "a standalone program's entry (`if __name__ == '__main__'`), run as a script inside "
    "a rollout's sandbox or container (producers/harnesses/programs, producers/runtimes/relay.py)",
    "Adapter": "a hosted environment's adapter (environment/hosted/adapters/, one per kind): "
    "what host.py builds from the environment's target and args in the environment's own venv",
}
"""Names more than one module may define, each with the one meaning it has everywhere."""


def top_level_names() -> dict[str, list[str]]:
    """Public top-level class and function name -> the modules that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    if not node.name.startswith("_"):
                        found[node.name].append(module_name(path))
    return found


def test_no_two_modules_define_one_name_unless_listed() -> None:
    clashes = {
        name: modules
        for name, modules in sorted(top_level_names().items())
        if len(set(modules)) > 1 and name not in ALLOWED
    }
    listing = "".join(f"\n  {name}: {', '.join(modules)}" for name, modules in clashes.items())
    assert not clashes, (
        "names defined at the top level of two or more modules (rename one, or list it in "
        f"ALLOWED with the one meaning it has everywhere):{listing}"
    )


def test_every_allowed_name_is_still_shared() -> None:
    """An entry no longer needed goes, so the list stays the short list of real exceptions."""
    names = top_level_names()
    stale = [name for name in ALLOWED if len(set(names.get(name, ()))) < 2]
    assert not stale, f"ALLOWED names that no two modules define any more: {stale}"
