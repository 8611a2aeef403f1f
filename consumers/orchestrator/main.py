"""The orchestrator role's entry (`rlbus worker orchestrator`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rlbus.bus import Bus
from rlbus.config.runs import RunConfig
from rlbus.consumers.orchestrator.build import build_orchestrator
from rlbus.consumers.orchestrator.loop import Orchestrator, run_orchestrator


async def run(cfg: RunConfig, base_dir: Path, stop: asyncio.Event) -> Orchestrator:
    """Turn scored rollouts into batches and publish tasks until the run is done (max_steps and
    the final evaluation; `done` is set) or `stop`. Environment paths in `cfg` are relative to
    `base_dir`. Raises ConfigError, KeyError or ValueError for a config it cannot build."""
    async with Bus.of(cfg) as bus:
        orchestrator = build_orchestrator(bus, cfg, base_dir)
        return await run_orchestrator(bus, orchestrator, stop)
