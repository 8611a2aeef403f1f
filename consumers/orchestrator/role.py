"""The orchestrator role (`rlbus worker orchestrator`): scored rollouts -> TrainBatches, tasks
published with bounded work in flight. One leads a run: another started for it waits as a
standby and takes over when the leader is gone."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from rlbus.bus import Bus
from rlbus.bus.heap import heap_returned
from rlbus.bus.leadership import Leadership
from rlbus.bus.role import RoleSummary
from rlbus.config.runs import RunConfig
from rlbus.consumers.orchestrator.build import build_orchestrator
from rlbus.consumers.orchestrator.orchestration import (
    GROUP,
    TOPICS,
    Orchestrator,
    run_orchestrator,
    summary,
)
from rlbus.schemas import group_of

log = logging.getLogger(__name__)


class OrchestratorRole:
    """Turns scored rollouts into batches and publishes tasks until the run is done
    (max_steps and the final evaluation) or `stop`, while this process leads the run: until
    then it waits as a standby, and if another takes over it waits again. Environment paths in
    `cfg` are relative to `base_dir`. A config it cannot build raises ConfigError, KeyError or
    ValueError before it joins anything."""

    name = "orchestrator"
    reads = tuple(TOPICS)
    writes = ("batches", "tasks")

    def __init__(self, cfg: RunConfig, base_dir: Path):
        self.cfg = cfg
        self.base_dir = base_dir
        self.orchestrator: Orchestrator | None = None
        """The last term's, once this process has led (None: stopped as a standby)."""

    def groups(self) -> list[str]:
        return [group_of(GROUP, self.cfg.run_id), self._leader_group()]

    def _leader_group(self) -> str:
        return group_of(f"{GROUP}-leader", self.cfg.run_id)

    def describe(self) -> str:
        return f"orchestrator of run {self.cfg.run_id!r}: {self.cfg.max_steps} steps"

    async def run(self, stop: asyncio.Event) -> RoleSummary:
        cfg = self.cfg
        async with (
            Bus.of(cfg) as bus,
            Leadership(bus, self._leader_group()) as lead,
            heap_returned(),
        ):
            build_orchestrator(bus, cfg, self.base_dir)  # a config it cannot build fails now
            while await lead.acquired(stop):
                log.info("leading run %s", cfg.run_id)
                # What earlier leaders did is on the bus: each term starts from it afresh.
                self.orchestrator = build_orchestrator(bus, cfg, self.base_dir)
                await run_orchestrator(bus, self.orchestrator, stop, lead)
                if self.orchestrator.done.is_set() or stop.is_set():
                    break
        o = self.orchestrator
        if o is None:
            return RoleSummary(self.name, "orchestrator stopped as a standby", finished=False)
        figures = summary(o)
        return RoleSummary(self.name, str(figures), finished=o.done.is_set(), figures=figures)
