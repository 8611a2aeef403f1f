"""The registry of roles: one entry each, naming its door (the module and class that implement
`rlbus.bus.role.Role`). `rlbus worker ROLE`, `rlbus run`'s child processes (which are
`rlbus worker ROLE`), the quickstart's local runs and the in-process runner of tests and
benchmarks all build roles here; a door is imported only when its role is built, so starting a
sink loads no torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from rlbus.bus.role import Role


@dataclass(frozen=True)
class RoleEntry:
    name: str
    door: str
    """`module:Class` of the role."""
    does: str
    """What it does, one line (`rlbus worker --help`)."""
    stop_rank: int
    """When a local run stops it: lower first (producers before the trainer finishes its batch,
    the sink last, so that it stores what the others published while stopping)."""
    needs_train_extra: bool = False
    """It imports torch (`pip install 'rlbus[train]'`)."""

    def load(self) -> Callable[..., Role]:
        """The role's class (importing its door)."""
        module, _, cls = self.door.partition(":")
        return cast(Callable[..., Role], getattr(importlib.import_module(module), cls))


ROLES: dict[str, RoleEntry] = {
    e.name: e
    for e in (
        RoleEntry(
            "orchestrator",
            "rlbus.consumers.orchestrator.role:OrchestratorRole",
            "scored rollouts -> training batches; publishes tasks with bounded work in flight",
            stop_rank=0,
        ),
        RoleEntry(
            "env",
            "rlbus.producers.role:EnvProducerRole",
            "tasks -> rollouts, with their trace nodes and token records",
            stop_rank=1,
        ),
        RoleEntry(
            "judge",
            "rlbus.consumers.judge.role:JudgeRole",
            "rollouts -> scores (group rewards once a group is complete)",
            stop_rank=2,
        ),
        RoleEntry(
            "trainer",
            "rlbus.consumers.trainer.role:TrainerRole",
            "batches -> optimizer steps, weight versions and checkpoints",
            stop_rank=3,
            needs_train_extra=True,
        ),
        RoleEntry(
            "inference",
            "rlbus.consumers.inference.role:InferenceRole",
            "serves the model, loading every weight version of its run",
            stop_rank=4,
            needs_train_extra=True,
        ),
        RoleEntry(
            "sink",
            "rlbus.consumers.sink.role:SinkRole",
            "every topic -> the ClickHouse store",
            stop_rank=5,
        ),
    )
}


def build_role(name: str, *args: Any, **options: Any) -> Role:
    """The role `name`, built from its settings (and its own options)."""
    if name not in ROLES:
        raise KeyError(f"no role {name!r}; the roles are {', '.join(ROLES)}")
    return ROLES[name].load()(*args, **options)
