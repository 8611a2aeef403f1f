"""A whole run in this process's event loop (tests and benchmarks: no process start-up, one
place to look): every role as a task on the configured broker, and the store held here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, cast

from rlbus.bus import Bus, free_port
from rlbus.bus.store import Store, open_store
from rlbus.bus.store.reads.common import FINAL_STEP
from rlbus.bus.waiting import wait_until
from rlbus.config import data_dir
from rlbus.config.runs import RunConfig
from rlbus.consumers.orchestrator.orchestration import Orchestrator
from rlbus.environment import load_environment
from rlbus.launch.env_files import env_file
from rlbus.launch.roles import build_role

ExtraRole = Callable[[Bus, asyncio.Event], Coroutine[Any, Any, Any]]


def raise_if_failed(roles: Sequence[asyncio.Task], run_id: str) -> None:
    """A role that failed (a trainer refusing its checkpoint) fails what waits on the run."""
    for role in roles:
        if role.done() and not role.cancelled() and (error := role.exception()) is not None:
            raise RuntimeError(f"a role of run {run_id} failed") from error


@contextlib.asynccontextmanager
async def local_roles(
    cfg: RunConfig, base_dir: Path, extra: Sequence[ExtraRole] = ()
) -> AsyncIterator[tuple[RunConfig, Bus, Store, list[asyncio.Task]]]:
    """Every role but the orchestrator: with inference.url empty, the built-in engine serves
    cfg.model and follows weights; `extra` roles run alongside (e.g. a scripted inference's
    weight acknowledgements). Yields the config (inference.url filled in), a bus, the store and
    the roles' tasks; the roles stop on leaving."""
    stop = asyncio.Event()
    trainer_stop = asyncio.Event()
    """The trainer's own: it sets it at max_steps, which must not stop the others."""
    roles: list[asyncio.Task] = []
    url = cfg.inference.url
    if not url:
        port = free_port()
        url = f"http://127.0.0.1:{port}/v1"
        inference = build_role("inference", cfg, cfg.model, port=port)
        roles.append(asyncio.create_task(inference.run(stop)))
    cfg = cfg.model_copy(update={"inference": cfg.inference.model_copy(update={"url": url})})
    envs_dir = data_dir(cfg) / "runs" / cfg.run_id / "envs"
    try:
        with open_store(cfg.store.url) as store:
            async with Bus.of(cfg) as bus:
                roles.append(asyncio.create_task(build_role("sink", cfg, store).run(stop)))
                for name, entry in cfg.envs.items():
                    path = env_file(entry, name, base_dir, envs_dir, cfg.model, [url])
                    env = load_environment(str(path))
                    for _ in range(entry.producers):
                        producer = build_role("env", cfg, env, run_envs=frozenset(cfg.envs))
                        roles.append(asyncio.create_task(producer.run(stop)))
                    for _ in range(entry.judges):
                        roles.append(asyncio.create_task(build_role("judge", cfg, [env]).run(stop)))
                trainer = build_role("trainer", cfg)
                roles.append(asyncio.create_task(trainer.run(trainer_stop)))
                roles += [asyncio.create_task(role(bus, stop)) for role in extra]
                yield cfg, bus, store, roles
    finally:
        stop.set()
        trainer_stop.set()
        await asyncio.gather(*roles, return_exceptions=True)


async def run_in_process(
    cfg: RunConfig, base_dir: Path, extra: Sequence[ExtraRole] = (), timeout_s: float = 600
) -> Orchestrator:
    """`local_roles` and the orchestrator (built through the registry like the others). Returns
    once the orchestrator is done and its last events are stored; a role that fails meanwhile
    fails the run."""
    async with local_roles(cfg, base_dir, extra) as (cfg, _, store, roles):
        role = build_role("orchestrator", cfg, base_dir)
        orchestrating = asyncio.create_task(role.run(asyncio.Event()))
        try:
            await wait_until(
                orchestrating.done,
                timeout_s,
                f"the orchestrator of run {cfg.run_id}",
                check=lambda: raise_if_failed(roles, cfg.run_id),
            )
        finally:
            orchestrating.cancel()
        summary = orchestrating.result()
        orchestrator: Orchestrator | None = cast(Any, role).orchestrator  # its last term's
        assert orchestrator is not None and summary.finished, summary
        final = {"run": cfg.run_id, "step": cfg.max_steps}
        landed = lambda: bool(store.query(FINAL_STEP, final).rows[0][0])  # noqa: E731
        await wait_until(landed, 60, f"step {cfg.max_steps} of run {cfg.run_id} in the store")
        await asyncio.sleep(1.5)  # one more sink flush for what came with the final step
    return orchestrator
