"""The role contract: what every role (env producer, judge, orchestrator, trainer, inference,
sink) is to whatever starts it.

A role is built from its settings (and the few options only it has: the environments it runs,
the model it serves), declares the topics it reads and writes and the consumer groups it joins,
and runs until its work is done or `stop` is set, returning what it did. Every launcher
(`rlbus worker ROLE`, `rlbus run`'s processes, the in-process runner of tests and benchmarks)
starts roles through the registry of them in `rlbus.launch.roles`, and only through this shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol


@dataclass(frozen=True)
class RoleSummary:
    """What a role did, once it returned."""

    role: str
    said: str
    """One line for a person ("judge stopped after scoring 128 rollouts")."""
    finished: bool = True
    """False when it stopped before its work was done (an orchestrator before max_steps): a
    launcher tells that apart from a run that ended."""
    figures: Mapping[str, object] = field(default_factory=dict)


class Role(Protocol):
    name: ClassVar[str]
    """The role's name in the registry and on the command line (`rlbus worker NAME`)."""
    reads: ClassVar[tuple[str, ...]]
    """Topics it consumes (without the prefix)."""
    writes: ClassVar[tuple[str, ...]]
    """Topics it publishes to."""

    def groups(self) -> list[str]:
        """The consumer groups it joins."""
        ...

    def describe(self) -> str:
        """What it is about to do, one line, said before it runs."""
        ...

    async def run(self, stop: asyncio.Event) -> RoleSummary:
        """Work until done or `stop`; raise for a setting it cannot run with."""
        ...
