"""A whole run in this process's event loop (tests and benchmarks: no process start-up, one
place to look): every role as a task on the configured broker, and the store held here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from rlbus.bus import Bus, free_port
from rlbus.bus.store import Store, open_store
from rlbus.bus.waiting import wait_until
from rlbus.config import data_dir
from rlbus.config.runs import RunConfig
from rlbus.consumers.orchestrator.loop import Orchestrator
from rlbus.launch.dashboard import FINAL_STEP
from rlbus.launch.env_files import env_file

ExtraRole = Callable[[Bus, asyncio.Event], Coroutine[Any, Any, Any]]


@contextlib.asynccontextmanager
async def local_roles(
    cfg: RunConfig, base_dir: Path, extra: Sequence[ExtraRole] = ()
) -> AsyncIterator[tuple[RunConfig, Bus, Store]]:
    """Every role but the orchestrator: with inference.url empty, the built-in engine serves
    cfg.model and follows weights; `extra` roles run alongside (e.g. a scripted inference's
    weight acknowledgements). Yields the config (inference.url filled in), a bus and the store;
    the roles stop on leaving."""
    from rlbus.consumers.inference.main import run as serve
    from rlbus.consumers.judge.main import run as run_judge
    from rlbus.consumers.sink import run_sink
    from rlbus.consumers.trainer.main import trainer_role
    from rlbus.environment import load_environment
    from rlbus.producers.main import run as run_env_producer

    stop = asyncio.Event()
    trainer_stop = asyncio.Event()
    """The trainer's own: it sets it at max_steps, which must not stop the others."""
    roles: list[asyncio.Task] = []
    url = cfg.inference.url
    if not url:
        port = free_port()
        url = f"http://127.0.0.1:{port}/v1"
        roles.append(asyncio.create_task(serve(cfg, cfg.model, stop, port=port)))
    cfg = cfg.model_copy(update={"inference": cfg.inference.model_copy(update={"url": url})})
    envs_dir = data_dir(cfg) / "runs" / cfg.run_id / "envs"
    try:
        with trainer_role(cfg, resume=False) as trainer, open_store(cfg.store.url) as store:
            async with Bus.of(cfg) as bus:
                roles.append(asyncio.create_task(run_sink(cfg, store, stop)))
                for name, entry in cfg.envs.items():
                    path = env_file(entry, name, base_dir, envs_dir, cfg.model, [url])
                    env = load_environment(str(path))
                    for _ in range(entry.producers):
                        producer = run_env_producer(cfg, env, stop, run_envs=frozenset(cfg.envs))
                        roles.append(asyncio.create_task(producer))
                    for _ in range(entry.judges):
                        roles.append(asyncio.create_task(run_judge(cfg, [env], stop)))
                roles.append(asyncio.create_task(trainer.run(trainer_stop)))
                roles += [asyncio.create_task(role(bus, stop)) for role in extra]
                yield cfg, bus, store
    finally:
        stop.set()
        trainer_stop.set()
        await asyncio.gather(*roles, return_exceptions=True)


async def run_in_process(
    cfg: RunConfig, base_dir: Path, extra: Sequence[ExtraRole] = (), timeout_s: float = 600
) -> Orchestrator:
    """`local_roles` and the orchestrator. Returns once the orchestrator is done and its last
    events are stored."""
    from rlbus.consumers.orchestrator.build import build_orchestrator
    from rlbus.consumers.orchestrator.loop import run_orchestrator

    async with local_roles(cfg, base_dir, extra) as (cfg, bus, store):
        orchestrator = build_orchestrator(bus, cfg, base_dir)
        await asyncio.wait_for(run_orchestrator(bus, orchestrator, asyncio.Event()), timeout_s)
        final = {"run": cfg.run_id, "step": cfg.max_steps}
        landed = lambda: bool(store.query(FINAL_STEP, final).rows[0][0])  # noqa: E731
        await wait_until(landed, 60, f"step {cfg.max_steps} of run {cfg.run_id} in the store")
        await asyncio.sleep(1.5)  # one more sink flush for what came with the final step
    return orchestrator
