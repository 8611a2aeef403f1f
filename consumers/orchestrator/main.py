"""The orchestrator role's entry (`rlbus worker orchestrator`)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from rlbus.bus import Bus
from rlbus.bus.leadership import Leadership
from rlbus.config.runs import RunConfig
from rlbus.consumers.orchestrator.build import build_orchestrator
from rlbus.consumers.orchestrator.loop import GROUP, Orchestrator, run_orchestrator
from rlbus.schemas import group_of

log = logging.getLogger(__name__)


async def run(cfg: RunConfig, base_dir: Path, stop: asyncio.Event) -> Orchestrator | None:
    """Turn scored rollouts into batches and publish tasks until the run is done (max_steps and
    the final evaluation; `done` is set) or `stop`, while this process leads the run: until
    then it waits as a standby (None if `stop` comes first), and if another takes over it waits
    again. Environment paths in `cfg` are relative to `base_dir`. Raises ConfigError, KeyError
    or ValueError for a config it cannot build."""
    async with Bus.of(cfg) as bus, Leadership(bus, group_of(f"{GROUP}-leader", cfg.run_id)) as lead:
        build_orchestrator(bus, cfg, base_dir)  # a config it cannot build fails now, not later
        orchestrator = None
        while await lead.acquired(stop):
            log.info("leading run %s", cfg.run_id)
            # What earlier leaders did is on the bus: each term starts from it afresh.
            orchestrator = build_orchestrator(bus, cfg, base_dir)
            await run_orchestrator(bus, orchestrator, stop, lead)
            if orchestrator.done.is_set() or stop.is_set():
                break
        return orchestrator
