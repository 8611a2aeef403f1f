"""`rlbus run`: the run config, and every role of a run as local processes on one machine.

Starts the embedded broker (unless one is configured), a sink holding the store, inference,
the trainer, the orchestrator, and env producers and judges per environment; shows a live
dashboard read from the store; stops everything cleanly when the orchestrator is done
(max_steps and the final evaluation), on Ctrl-C, or when a role dies (naming it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from rlbus.bus import Bus, free_port
from rlbus.bus.store import Store, open_store
from rlbus.config import Settings, data_dir
from rlbus.config.orchestrator import EnvEntry
from rlbus.config.run import RunConfig
from rlbus.discovery import local_broker, store_served_elsewhere
from rlbus.processes import RoleProcess, wait_for

if TYPE_CHECKING:
    from rlbus.consumers.orchestrator.worker import Orchestrator


def dump_toml(data: dict[str, Any], prefix: str = "") -> str:
    """A TOML document of nested dicts of scalars and lists of scalars (enough for env configs)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"cannot write {v!r} to TOML")

    lines = [
        f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict) and v is not None
    ]
    tables = [dump_toml(v, f"{prefix}{k}.") for k, v in data.items() if isinstance(v, dict)]
    head = [f"[{prefix[:-1]}]"] if prefix and lines else []
    return "\n".join([*head, *lines, *tables]) + "\n"


def env_file(
    entry: EnvEntry, name: str, base_dir: Path, out_dir: Path, model: str, base_url: str
) -> Path:
    """The environment's TOML with the run's overrides and the train-mode model endpoint, for its
    env producers and judges (which take an environment spec, not a run config)."""
    from rlbus.config import deep_merge
    from rlbus.producers.environment.loader import ENV_FILE, _toml

    path = Path(entry.path) if Path(entry.path).is_absolute() else base_dir / entry.path
    source = path / ENV_FILE if path.is_dir() else path
    table = _toml(source)
    taskset, _, attr = table["taskset"].partition(":")
    if taskset.endswith(".py") and not Path(taskset).is_absolute():
        table["taskset"] = str((source.parent / taskset).resolve()) + (f":{attr}" if attr else "")
    model_cfg = {
        "name": Path(model).name,
        "base_url": base_url,
        "mode": "train",
        "tokenizer": str(Path(model).resolve()),
    }
    merged = deep_merge(deep_merge(table, entry.overrides), {"id": name, "model": model_cfg})
    out = out_dir / f"{name}.toml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dump_toml({"env": merged}))
    return out


def healthy(url: str) -> bool:
    """Whether the server behind a /v1 URL answers GET /health."""
    try:
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@dataclass
class Dashboard:
    run_id: str
    url: str
    started: float = field(default_factory=time.monotonic)
    refreshed: float = 0.0
    figures: dict[str, str] = field(default_factory=dict)

    def refresh(self) -> Table:
        self.refreshed = time.monotonic()
        try:
            with open_store(self.url, read_only=True) as store:
                self.figures = _figures(store, self.run_id)
        except Exception as exc:
            self.figures.setdefault("store", f"waiting ({type(exc).__name__})")
        table = Table(
            title=f"rlbus run {self.run_id} · {time.monotonic() - self.started:,.0f}s",
            show_header=False,
        )
        for name, val in self.figures.items():
            table.add_row(name, val)
        return table


def _figures(store: Any, run_id: str) -> dict[str, str]:
    p = {"run": run_id}
    step = store.query(
        "SELECT step, loss, grad_norm, entropy, mismatch_kl, tokens_per_s, num_samples, dropped_stale, staleness "
        "FROM train_steps FINAL WHERE run_id = {run:String} ORDER BY step DESC LIMIT 1",
        p,
    ).rows
    reward = store.query(
        "SELECT max(policy_version), avgIf(reward, status = 'ok'), count() FROM (SELECT policy_version, reward, "
        "status FROM scored FINAL WHERE run_id = {run:String} AND rollout_id IN (SELECT rollout_id FROM rollouts "
        "WHERE run_id = {run:String} AND JSONExtractString(info, 'split') = 'train') ORDER BY ts DESC LIMIT 256)",
        p,
    ).rows
    evals = store.query(
        "SELECT JSONExtractInt(r.info, 'eval_version') AS v, avg(s.reward >= 1), count() FROM scored AS s FINAL "
        "INNER JOIN (SELECT rollout_id, info FROM rollouts FINAL WHERE run_id = {run:String} AND "
        "JSONExtractString(info, 'split') = 'test') AS r ON s.rollout_id = r.rollout_id "
        "WHERE s.run_id = {run:String} GROUP BY v ORDER BY v",
        p,
    ).rows
    served = store.query(
        "SELECT max(version) FROM weights_loaded FINAL WHERE run_id = {run:String}", p
    ).rows
    out = {"store": "ok"}
    if step:
        s, loss, gn, ent, kl, tps, n, dropped, staleness = step[0]
        out |= {
            "step": str(s),
            "loss": f"{loss:.4f}",
            "grad norm": f"{gn:.3f}",
            "entropy": f"{ent:.3f}",
            "mismatch KL": f"{kl:.2e}",
            "trainer tokens/s": f"{tps:,.0f}",
            "samples/step": str(n),
            "staleness (versions behind: samples)": str(dict(staleness)),
            "dropped stale (last step)": str(dropped),
        }
    if reward and reward[0][2]:
        out["train reward (last 256 rollouts)"] = f"{reward[0][1]:.3f} (up to v{reward[0][0]})"
    if served and served[0][0] is not None:
        out["inference serves"] = f"v{served[0][0]}"
    if evals:
        out["held-out pass rate"] = "  ".join(f"v{v}: {rate:.2f}" for v, rate, _ in evals[-6:])
    return out


def _final_step_stored(url: str, run_id: str, step: int) -> bool:
    with open_store(url, read_only=True) as store:
        query = (
            "SELECT count() FROM train_steps FINAL WHERE run_id = {r:String} AND step = {s:UInt32}"
        )
        return bool(store.query(query, {"r": run_id, "s": step}).rows[0][0])


class LocalRun:
    """Every role of a run as child processes; `run()` blocks until done, Ctrl-C or a failure."""

    def __init__(
        self,
        cfg: RunConfig,
        config_path: Path,
        overrides: list[str],
        resume: bool,
        console: Console,
    ):
        self.cfg = cfg
        self.config_path = config_path.resolve()
        self.overrides = overrides
        self.resume = resume
        self.console = console
        self.run_dir = data_dir(cfg) / "runs" / cfg.run_id
        self.processes: list[RoleProcess] = []

    def _start(self, role: str, settings: Settings, args: list[str]) -> RoleProcess:
        process = RoleProcess(role, settings, self.run_dir / "logs", args)
        self.processes.append(process)
        return process

    def run(self, timeout_s: float = 600) -> int:
        """Returns the orchestrator's exit code (0: max_steps reached and evaluated)."""
        with local_broker(self.cfg.base()) as base:
            self.console.print(
                f"broker {base.kafka.bootstrap_servers} · store {base.store.url} · "
                f"logs {self.run_dir / 'logs'}"
            )
            try:
                return self._run(base, timeout_s)
            finally:
                self.stop()

    def _run(self, base: Settings, timeout_s: float) -> int:
        run_args = [
            "--config",
            str(self.config_path),
            *self.overrides,
            "--kafka.bootstrap-servers",
            base.kafka.bootstrap_servers or "",
            *(["--resume"] if self.resume else []),
        ]
        # Every role starts at once (on a small machine their imports and model loads take most
        # of the start-up, and none needs another to be up first: the orchestrator sends no task
        # before inference announces the trainer's first version). Only the dashboard, which
        # opens the store, waits for the sink to hold it.
        sink = self._start("sink", base, [])
        url = self.cfg.inference.url
        if not url:
            port = self.cfg.inference.port or free_port()
            url = f"http://127.0.0.1:{port}/v1"
            self._start(
                "inference",
                base,
                [
                    "--model",
                    str(Path(self.cfg.model).resolve()),
                    "--port",
                    str(port),
                    "--backend",
                    self.cfg.inference.backend,
                    "--device",
                    self.cfg.inference.device,
                    "--threads",
                    str(self.cfg.inference.threads),
                ],
            )
        trainer = self._start("trainer", base, run_args)
        orchestrator = self._start("orchestrator", base, [*run_args, "--inference.url", url])
        for name, entry in self.cfg.envs.items():
            path = env_file(
                entry, name, self.config_path.parent, self.run_dir / "envs", self.cfg.model, url
            )
            for _ in range(entry.producers):
                self._start("env", base, [str(path)])
            for _ in range(entry.judges):
                self._start("judge", base, [str(path)])
        # Roles that run until stopped, so any exit is a failure (the trainer may end at max_steps).
        services = tuple(p for p in self.processes if p is not orchestrator and p is not trainer)
        wait_for(
            lambda: store_served_elsewhere(base),
            timeout_s,
            "the sink to serve the store",
            processes=services,
        )
        wait_for(lambda: healthy(url), timeout_s, f"inference at {url}", processes=services)
        dashboard = Dashboard(self.cfg.run_id, base.store.url)
        with Live(dashboard.refresh(), console=self.console, refresh_per_second=2) as live:
            while orchestrator.alive():
                for p in services:
                    p.check()
                if not trainer.alive() and trainer.proc.returncode != 0:
                    trainer.check()
                time.sleep(1.0)
                if time.monotonic() - dashboard.refreshed > 3:  # its queries cost the sink CPU too
                    live.update(dashboard.refresh())
            if orchestrator.proc.returncode == 0:
                # The last events (final step, evaluation) reach the store before the sink stops.
                wait_for(
                    lambda: _final_step_stored(base.store.url, self.cfg.run_id, self.cfg.max_steps),
                    60,
                    "the final step in the store",
                    processes=(sink,),
                )
                time.sleep(2 * base.store.flush_interval_s + 1)
            live.update(dashboard.refresh())
        if orchestrator.proc.returncode != 0:
            orchestrator.check()
        return orchestrator.proc.returncode

    def stop(self) -> None:
        """Orchestrator and producers first, the trainer (finishing its batch), inference, the sink last."""
        order = {"orchestrator": 0, "env": 1, "judge": 2, "trainer": 3, "inference": 4, "sink": 5}
        for p in sorted(self.processes, key=lambda p: order.get(p.role, 9)):
            p.stop()


@contextlib.asynccontextmanager
async def local_roles(
    cfg: RunConfig,
    base_dir: Path,
    extra: Sequence[Callable[[Bus, asyncio.Event], Awaitable[Any]]] = (),
) -> AsyncIterator[tuple[RunConfig, Bus, Store]]:
    """Every role but the orchestrator in this process's event loop, on the configured broker
    and a store this process holds: with inference.url empty, the built-in engine serves
    cfg.model and follows weights; `extra` roles run alongside (e.g. a scripted inference's
    weight acknowledgements). Yields the config (inference.url filled in), a bus and the store;
    the roles stop on leaving."""
    from rlbus.consumers.inference.service import build_app, build_backend
    from rlbus.consumers.inference.worker import run_worker
    from rlbus.consumers.judge import run_judge
    from rlbus.consumers.sink import run_sink
    from rlbus.consumers.trainer.session import open_session
    from rlbus.consumers.trainer.worker import TrainerWorker, run_trainer
    from rlbus.producers.env_producer import run_env_producer
    from rlbus.producers.environment import load_environment

    stop = asyncio.Event()
    trainer_stop = asyncio.Event()
    """The trainer's own: it sets it at max_steps, which must not stop the others."""
    roles: list[asyncio.Task] = []
    url = cfg.inference.url
    if not url:
        port = free_port()
        url = f"http://127.0.0.1:{port}/v1"
        backend = build_backend(cfg.model)
        roles.append(
            asyncio.create_task(
                run_worker(cfg, backend, build_app(backend, cfg.model), "127.0.0.1", port, stop)
            )
        )
    cfg = cfg.model_copy(update={"inference": cfg.inference.model_copy(update={"url": url})})
    session = open_session(
        cfg.trainer, cfg.model, cfg.checkpoint_url(), cfg.max_steps, resume=False
    )
    try:
        with open_store(cfg.store.url) as store:
            async with Bus(cfg) as bus:
                roles.append(asyncio.create_task(run_sink(cfg, store, stop)))
                for name, entry in cfg.envs.items():
                    env = load_environment(
                        str(
                            env_file(
                                entry,
                                name,
                                base_dir,
                                data_dir(cfg) / "runs" / cfg.run_id / "envs",
                                cfg.model,
                                url,
                            )
                        )
                    )
                    roles += [
                        asyncio.create_task(run_env_producer(cfg, env, stop))
                        for _ in range(entry.producers)
                    ]
                    roles += [
                        asyncio.create_task(run_judge(cfg, [env], stop))
                        for _ in range(entry.judges)
                    ]
                roles.append(
                    asyncio.create_task(
                        run_trainer(
                            bus,
                            TrainerWorker(
                                bus,
                                session.trainer.step,
                                session.checkpoints,
                                session.state,
                                session.hooks,
                                cfg.run_id,
                                cfg.orchestrator.max_off_policy_steps,
                                cfg.max_steps,
                                trainer_stop,
                            ),
                        )
                    )
                )
                roles += [asyncio.create_task(role(bus, stop)) for role in extra]
                yield cfg, bus, store
    finally:
        stop.set()
        trainer_stop.set()
        await asyncio.gather(*roles, return_exceptions=True)


async def run_in_process(
    cfg: RunConfig,
    base_dir: Path,
    extra: Sequence[Callable[[Bus, asyncio.Event], Awaitable[Any]]] = (),
    timeout_s: float = 600,
) -> Orchestrator:
    """A whole run in this process's event loop (tests and benchmarks: no process start-up, one
    place to look): `local_roles` and the orchestrator. Returns once the orchestrator is done
    and its last events are stored."""
    from rlbus.consumers.orchestrator.build import build_orchestrator
    from rlbus.consumers.orchestrator.worker import run_orchestrator

    async with local_roles(cfg, base_dir, extra) as (cfg, bus, store):
        orchestrator = build_orchestrator(bus, cfg, base_dir)
        await asyncio.wait_for(run_orchestrator(bus, orchestrator, asyncio.Event()), timeout_s)
        await _stored(store, cfg.run_id, cfg.max_steps)
    return orchestrator


async def _stored(store: Any, run_id: str, step: int, timeout_s: float = 60) -> None:
    """Until the final TrainStep is in the store, then one more sink flush for what came with it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    query = "SELECT count() FROM train_steps FINAL WHERE run_id = {r:String} AND step = {s:UInt32}"
    while not store.query(query, {"r": run_id, "s": step}).rows[0][0]:
        if loop.time() > deadline:
            raise TimeoutError(
                f"step {step} of run {run_id} did not reach the store in {timeout_s:.0f}s"
            )
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.5)
