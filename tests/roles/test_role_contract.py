"""One door per role: every role of the registry implements rlbus.bus.role.Role, `rlbus worker`
has one command per registered role, and no launcher reaches a role but through the registry."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from rlbus.bus.role import Role, RoleSummary
from rlbus.commands.worker import COMMANDS
from rlbus.config import Settings
from rlbus.environment import load_environment
from rlbus.launch.roles import ROLES, build_role
from rlbus.schemas import TOPICS

ROOT = Path(__file__).resolve().parents[2]
TOPIC_NAMES = {t.name for t in TOPICS}


@pytest.mark.parametrize("name", sorted(ROLES))
def test_each_registered_role_is_a_role_named_as_registered(name: str) -> None:
    cls = ROLES[name].load()
    assert getattr(cls, "name", None) == name
    for attribute in ("reads", "writes"):
        topics = getattr(cls, attribute)
        assert isinstance(topics, tuple) and set(topics) <= TOPIC_NAMES, (attribute, topics)
    for method in ("groups", "describe", "run"):
        assert callable(getattr(cls, method, None)), method
    assert asyncio.iscoroutinefunction(cls.run)  # type: ignore[attr-defined]  # checked above


def test_rlbus_worker_has_one_command_per_registered_role() -> None:
    assert COMMANDS.keys() == ROLES.keys()


def test_an_unknown_role_is_refused_naming_the_roles() -> None:
    with pytest.raises(KeyError, match="no role 'jugde'; the roles are orchestrator, env"):
        build_role("jugde")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_launchers_reach_roles_only_through_the_registry() -> None:
    """The CLI, the launcher and the in-process runner import no role's door: they name the
    role in the registry, which imports it."""
    doors = {entry.door.partition(":")[0] for entry in ROLES.values()}
    launchers = [
        *(ROOT / "rlbus").rglob("*.py"),
        ROOT / "tests" / "support" / "in_process.py",
    ]
    wrong = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & doors)
        for path in launchers
        if path.name != "roles.py" and _imports(path) & doors
    }
    assert not wrong, f"launchers importing a role's door instead of the registry: {wrong}"


async def test_a_role_built_by_the_registry_runs_until_stopped(settings: Settings) -> None:
    env = load_environment(str(ROOT / "examples" / "reverse_text"), {})
    role: Role = build_role("judge", settings, [env])
    assert role.groups() == [f"judge.{settings.run_id}.reverse_text"]
    assert "judge for reverse_text" in role.describe()
    stop = asyncio.Event()
    running = asyncio.create_task(role.run(stop))
    await asyncio.sleep(1)
    assert not running.done()
    stop.set()
    done = await asyncio.wait_for(running, 60)
    assert isinstance(done, RoleSummary) and done.role == "judge" and done.finished
    assert done.figures == {"scored": 0, "incomplete": 0}
