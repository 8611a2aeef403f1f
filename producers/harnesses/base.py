"""What a harness gets for one rollout, and what it returns: the completion (the messages it
added after the prompt). Harnesses reach the model only through the rollout's session, so
every call is recorded whatever the harness."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from rlbus.environment.loader import Environment
from rlbus.producers.interception.server import RolloutSession
from rlbus.producers.runtimes.base import Sandbox
from rlbus.schemas import Messages, TaskPublished


@dataclass
class Rollout:
    task: TaskPublished
    prompt: Messages
    session: RolloutSession
    sandbox: Sandbox
    env: Environment
    state: dict[str, Any] = field(default_factory=dict)
    """Per-rollout scratch space shared by tools, the user simulator and (stored) the rewards."""

    def available(self, **extra: Any) -> dict[str, Any]:
        """Arguments a task set's tool or user method may ask for by name."""
        return {"task": self.task, "state": self.state, **extra}


class HarnessError(RuntimeError):
    """A rollout that could not finish; `kind` names why (timeout, memory, exit, ...)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Harness(Protocol):
    async def run(self, rollout: Rollout) -> Messages: ...
