"""`rlbus run`: every role of a run as local child processes on one machine, each
`rlbus worker ROLE` (so built through the registry of roles, rlbus.launch.roles).

Starts the embedded broker (unless one is configured), the sinks (one holds the store),
inference replicas, the trainer, the orchestrator (and its standbys), and env producers and
judges per environment; shows a live dashboard read from the store; stops everything cleanly
when an orchestrator is done (max_steps and the final evaluation), on Ctrl-C, or when every
process of a role has died (naming it; one of several dying is reported and the run goes on).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rich.console import Console, RenderableType
from rich.live import Live

from rlbus.bus import EmbeddedBroker, free_port
from rlbus.bus.broker_handover import Handover, hand_over
from rlbus.bus.store import open_store
from rlbus.bus.store.reads.common import FINAL_STEP
from rlbus.bus.waiting import wait_for
from rlbus.clients.inference_client import healthy
from rlbus.config import Settings, data_dir
from rlbus.config.runs import InferenceConfig, RunConfig
from rlbus.discovery import announce_moved, local_broker, reachable, store_served_elsewhere
from rlbus.launch.broker_losses import unstored
from rlbus.launch.dashboard import Dashboard
from rlbus.launch.env_files import env_file
from rlbus.launch.local_sink import LocalSink
from rlbus.launch.processes import KILL_AFTER_S, RoleProcess, exit_reason, rss_bytes
from rlbus.launch.roles import ROLES
from rlbus.launch.run_health import RunHealth, run_processes
from rlbus.launch.run_memory import check_run_fits
from rlbus.launch.teachers import Teacher, prepare_teachers, teacher_servers

MB = 1024 * 1024

TEACHER_RESTARTS = 3
"""How often a stored-version teacher's server is started again after it died, before the run
ends with its log (one that cannot stay up would otherwise be restarted forever)."""
STARTING_GRACE_S = 4.0
"""How long a role of a run still starting has to stop before it is killed: no work is in flight
yet (a trainer still loading its model stops at once), so a stop that takes longer only keeps
Ctrl-C waiting."""
HEALTH_STOP_S = 1.0
"""How long the run's health thread is waited for once every role has stopped."""
STARTING_STOP_S = 6.0
"""The longest the roles of a run still starting take to stop, sinks included. Ctrl-C must see
the launcher gone within 10 s: after the roles come the health thread (HEALTH_STOP_S), the
broker and the interpreter's own exit. Under three busy processes on two cores, the roles of a
run still loading stop within 1.2 s and the launcher 0.3 s after: env and inference load off
their event loop, and no rlbus process waits for the interpreter's last collection (rlbus.cli)."""


def embedded_limit_bytes(max_rss_mb: int) -> int:
    """kafka.embedded_max_rss_mb in bytes; 0: an eighth of this machine's memory."""
    if max_rss_mb:
        return max_rss_mb * MB
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8


@dataclass
class Roles:
    """The processes of a run that its supervision looks at by name."""

    sinks: list[RoleProcess]
    trainer: RoleProcess
    orchestrators: list[RoleProcess]
    """The first leads at the start; the others are standbys."""
    urls: list[str]
    """The inference replicas' /v1 URLs."""

    @property
    def sink(self) -> RoleProcess:
        return self.sinks[0]

    @property
    def orchestrator(self) -> RoleProcess:
        return self.orchestrators[0]


class RunView(Protocol):
    """What `rlbus run` shows while it runs, read from the store (the Dashboard by default)."""

    refreshed: float
    """time.monotonic() of the last refresh."""

    def refresh(self) -> RenderableType: ...


class BrokerLost(RuntimeError):
    """The broker of a run died under it (an embedded one holds its topics in memory)."""


@contextlib.contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM (systemd, Kubernetes, a script's timeout) raises KeyboardInterrupt while inside,
    in the main thread: its default would end the launcher at once, its roles left running."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def role_threads(role: str, inference_threads: int, cpus: int, replicas: int = 1) -> int:
    """Compute threads for one role of a local run. Inference and the trainer are the roles
    that compute: each inference replica gets its configured threads, the trainer the cores
    left (at least one); the others mostly wait on I/O and get one, so that no two roles' thread
    pools fight over the same cores (torch's default is a thread per core in every process)."""
    if role == "inference":
        return inference_threads
    if role == "trainer":
        return max(1, cpus - replicas * inference_threads)
    return 1


def thread_env(threads: int) -> dict[str, str]:
    """What sets a child's thread pools: torch's intra-op pool follows OMP_NUM_THREADS."""
    return {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def engine_overrides(inference: InferenceConfig) -> list[str]:
    """The [inference] table's engine settings that differ from their defaults, as
    `rlbus worker inference` overrides (--inference.vllm.dtype float32 ...)."""
    table = inference.model_dump(include={"python", "vllm", "hf"}, exclude_defaults=True)
    args: list[str] = []

    def flatten(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                flatten(f"{prefix}.{key}", inner)
        else:
            args.extend(
                [f"--{prefix}", str(value).lower() if isinstance(value, bool) else str(value)]
            )

    flatten("inference", table)
    return args


def banner(settings: Settings, logs: Path) -> str:
    """The line `rlbus run` starts with; the store URL shows without its password."""
    return f"broker {settings.kafka.bootstrap_servers} · store {settings.store.url} · logs {logs}"


class LocalRun:
    """Every role of a run as child processes; `run()` blocks until done, Ctrl-C or a failure."""

    def __init__(
        self,
        cfg: RunConfig,
        config_path: Path,
        overrides: list[str],
        resume: bool,
        console: Console,
        view: RunView | None = None,
    ):
        """`view`: what the run shows live (default: the Dashboard of the run)."""
        self.cfg = cfg
        self.config_path = config_path.resolve()
        self.overrides = overrides
        self.resume = resume
        self.console = console
        self.run_dir = data_dir(cfg) / "runs" / cfg.run_id
        self.view = view
        self.processes: list[RoleProcess] = []
        self.broker: EmbeddedBroker | None = None
        """The embedded broker this run started (None: a configured or announced one)."""
        self.started = time.time()
        """When this launch began: what the store holds from before belongs to earlier ones."""
        self.starting = False
        """`run()` has started the roles and inference does not serve yet: no task is out."""
        self.inference_ports: list[int] = []
        """The ports of the inference replicas started here."""
        self.teachers: list[Teacher] = []
        """The stored-version teachers this run serves (prepare_teachers, before any role)."""
        self.teacher_ports: dict[str, int] = {}
        self.teacher_processes: list[RoleProcess] = []
        self.teacher_restarts: dict[str, int] = {}
        self.handed_over = time.monotonic()
        """When the embedded broker was last replaced (or the run began)."""
        self.handovers: list[tuple[Handover, float]] = []
        """Each broker handover of this run: what it carried, and the seconds the run paused."""
        self.health = RunHealth(
            cfg.run_id, cfg.health, lambda: run_processes(self.processes, self.broker)
        )
        """Memory and lag samples, and incidents (`self.health.incident(...)`), into the store."""

    @property
    def acks(self) -> Path:
        """Where this launch's processes write what the broker acknowledged (bus.ledger)."""
        return self.run_dir / "acks" / f"{self.started:.0f}"

    def unstored(self) -> dict[str, int]:
        """After the broker died and the roles stopped: what it took with it, per topic."""
        with open_store(self.cfg.store.url, read_only=True) as store:
            return unstored(store, self.acks, self.cfg.kafka.topic_prefix, self.started)

    def _check_broker(self, address: str) -> None:
        """Raise BrokerLost when the run's broker is gone."""
        gone = not self.broker.alive() if self.broker is not None else not reachable(address)
        if gone:
            raise BrokerLost(f"the broker at {address} is gone")

    def _start(self, role: str, settings: Settings, args: list[str], name: str = "") -> RoleProcess:
        """`name`: of its log and its memory curve (default: the role's, numbered after the
        first: env.log, env-2.log...)."""
        inference = self.cfg.inference
        cpus = os.cpu_count() or 1
        env = thread_env(role_threads(role, inference.threads, cpus, inference.replicas))
        same = sum(p.role == role for p in self.processes)
        name = name or (f"{role}-{same + 1}" if same else role)
        process = RoleProcess(role, settings, self.run_dir / "logs", args, env, name)
        self.processes.append(process)
        return process

    def run(self, timeout_s: float = 600) -> int:
        """Returns the orchestrator's exit code (0: max_steps reached and evaluated). SIGTERM
        stops it as Ctrl-C does (KeyboardInterrupt, the roles stopped in order)."""
        self.started = time.time()
        self.handed_over = time.monotonic()
        check_run_fits(self.cfg)  # NotEnoughMemory, with the estimates, before anything starts
        # TeacherError, naming the environment and the teacher, before anything starts.
        self.teachers = prepare_teachers(self.cfg, self.run_dir)
        for teacher in self.teachers:
            envs = ", ".join(teacher.envs)
            served = f"adapter {teacher.adapter} on" if teacher.adapter else ""
            said = f"teacher of {envs}: {teacher.ref} ({served} {teacher.model_dir})"
            self.console.print(said, markup=False)
        with terminated_as_interrupt(), local_broker(self.cfg.base()) as (base, broker):
            self.broker = broker
            ledger = str(self.acks)
            base = base.model_copy(
                update={"kafka": base.kafka.model_copy(update={"ack_ledger": ledger})}
            )
            self.console.print(banner(base, self.run_dir / "logs"), markup=False)
            self.health.start(base)
            for teacher in self.teachers:  # the run's page and report name its teachers
                envs = ", ".join(teacher.envs)
                self.health.incident("teacher", f"{teacher.ref} teaches {envs}", teacher.name)
            try:
                return self._run(base, timeout_s)
            finally:
                # A stopped run exits within 10 s of Ctrl-C, roles and all: the health thread
                # winds down while the roles stop, and what it has not sent by then is dropped.
                self.health.wind_down()
                self.stop()
                self.health.stop(HEALTH_STOP_S)

    def _inference_urls(self, base: Settings) -> list[str]:
        """The configured inference servers, else the replicas started here."""
        inference = self.cfg.inference
        if inference.given():
            return inference.given()
        if not self.inference_ports:
            # Kept across restarts: a replica's consumer group is named after its port.
            first = inference.port
            self.inference_ports = [
                first + i if first else free_port() for i in range(inference.replicas)
            ]
        urls = []
        for port in self.inference_ports:
            self._start("inference", base, self._serving(Path(self.cfg.model).resolve(), port))
            urls.append(f"http://127.0.0.1:{port}/v1")
        return urls

    def _serving(self, model: Path, port: int) -> list[str]:
        """`rlbus worker inference`'s arguments to serve `model` on `port` as configured."""
        inference = self.cfg.inference
        args = ["--model", str(model), "--port", str(port)]
        args += ["--backend", inference.backend, "--device", inference.device]
        return [*args, "--threads", str(inference.threads), *engine_overrides(inference)]

    def _start_teachers(self, base: Settings) -> list[str]:
        """Serve each stored-version teacher, frozen; the orchestrator's overrides that point
        its environments at them (a port is kept across restarts)."""
        overrides: list[str] = []
        self.teacher_processes = []
        for server in teacher_servers(self.teachers):
            port = self.teacher_ports.setdefault(server.name, free_port())
            serving = [*self._serving(server.model_dir, port), "--frozen"]
            for name, path in server.adapters.items():
                serving += ["--adapter", f"{name}={path}"]
            self.teacher_processes.append(self._start("inference", base, serving, name=server.name))
            url = f"http://127.0.0.1:{port}/v1"
            for teacher in server.teachers:
                for env in teacher.envs:
                    overrides += [f"--envs.{env}.algorithm.teacher="]
                    overrides += [f"--envs.{env}.algorithm.teacher-url", url]
                    if teacher.adapter is not None:
                        overrides += [f"--envs.{env}.algorithm.teacher-model", teacher.name]
        return overrides

    def _revive_teachers(self) -> None:
        """Start a teacher's server that died again, on its port: it holds no state (its
        version is on disk), and the orchestrator waits for a teacher that does not answer.
        Past TEACHER_RESTARTS deaths the run ends with its log."""
        for p in self.teacher_processes:
            if p.alive():
                continue
            restarts = self.teacher_restarts[p.name] = self.teacher_restarts.get(p.name, 0) + 1
            if restarts > TEACHER_RESTARTS:
                p.check()  # raises, with its log tail
            said = f"{exit_reason(p.role, p.proc.returncode)}; started again ({restarts})"
            self.health.incident("role-restarted", said, p.name)
            self.console.print(f"teacher {p.name}: {said} (log: {p.log_path})", markup=False)
            p.restart()

    def start_roles(self, base: Settings) -> Roles:
        """Start every role of the run on `base`'s broker and store."""
        run_args = ["--config", str(self.config_path), *self.overrides]
        run_args += ["--kafka.bootstrap-servers", base.kafka.bootstrap_servers or ""]
        run_args += ["--resume"] if self.resume else []
        # Every role starts at once (on a small machine their imports and model loads take most
        # of the start-up, and none needs another to be up first: the orchestrator sends no task
        # before inference announces the trainer's first version). Only the dashboard, which
        # opens the store, waits for a sink to hold it.
        sinks = [self._start("sink", base, []) for _ in range(self.cfg.sinks)]
        urls = self._inference_urls(base)
        trainer = self._start("trainer", base, run_args)
        # The policy's server for self-distillation's teacher: any replica serves the policy.
        orchestrator_args = [*run_args, "--inference.url", urls[0], *self._start_teachers(base)]
        orchestrators = [
            self._start("orchestrator", base, orchestrator_args)
            for _ in range(1 + self.cfg.orchestrator.standbys)
        ]
        envs_dir = self.run_dir / "envs"
        for name, entry in self.cfg.envs.items():
            path = env_file(entry, name, self.config_path.parent, envs_dir, self.cfg.model, urls)
            run_envs = ",".join(self.cfg.envs)
            for _ in range(entry.producers):
                self._start("env", base, [str(path), "--run-envs", run_envs])
            for _ in range(entry.judges):
                self._start("judge", base, [str(path)])
        return Roles(sinks, trainer, orchestrators, urls)

    def _services(self, roles: Roles) -> Callable[[], None]:
        """A check that fails when every process of a role that runs until stopped (all but the
        orchestrators and the trainer, which may end at max_steps, and the teachers, which are
        started again) has exited, and reports once each one of several that died while others
        go on."""
        reported: set[int] = set()
        by_role: dict[str, list[RoleProcess]] = {}
        others = [roles.trainer, *roles.orchestrators, *self.teacher_processes]  # _revive_teachers
        for p in self.processes:
            if not any(p is q for q in others):
                by_role.setdefault(p.role, []).append(p)

        def check() -> None:
            for processes in by_role.values():
                if not any(p.alive() for p in processes):
                    processes[0].check()  # raises, with its log tail
                for p in processes:
                    if not p.alive() and id(p) not in reported:
                        reported.add(id(p))
                        left = sum(q.alive() for q in processes)
                        exited = f"{exit_reason(p.role, p.proc.returncode)}; {left} go on"
                        self.health.incident("role-exited", exited, p.name)
                        self.console.print(
                            f"{exit_reason(p.role, p.proc.returncode)}; {left} of "
                            f"{len(processes)} {p.role} processes go on (log: {p.log_path})",
                            markup=False,
                        )

        return check

    def _start_serving(self, base: Settings, timeout_s: float) -> Roles:
        """Start every role and wait until the store is served and inference answers."""
        self.starting = True
        roles = self.start_roles(base)
        trainer, services = roles.trainer, self._services(roles)

        def failed_to_start() -> None:
            """While the run starts: a service gone, or a trainer that failed (refused its
            model, its checkpoint), ends it at once."""
            services()
            if not trainer.alive() and trainer.proc.returncode != 0:
                trainer.check()

        served = "a sink to serve the store"
        wait_for(lambda: store_served_elsewhere(base), timeout_s, served, check=failed_to_start)
        urls = " or ".join(roles.urls)
        wait_for(
            lambda: any(healthy(u) for u in roles.urls),
            timeout_s,
            f"inference at {urls}",
            check=failed_to_start,
        )
        self.starting = False
        return roles

    def _run(self, base: Settings, timeout_s: float) -> int:
        roles = self._start_serving(base, timeout_s)
        services = self._services(roles)
        dashboard = self.view or Dashboard(self.cfg.run_id, base.store.url)

        def finished() -> RoleProcess | None:
            """The orchestrator that ended the run (done, or the last one's failure)."""
            orchestrators = roles.orchestrators
            done = [o for o in orchestrators if o.proc.poll() == 0]
            if done:
                return done[0]
            return None if any(o.alive() for o in orchestrators) else orchestrators[-1]

        with Live(dashboard.refresh(), console=self.console, refresh_per_second=2) as live:
            while (ended := finished()) is None:
                self._check_broker(base.kafka.bootstrap_servers or "")
                if self.broker_full(base):
                    base, roles = self.replace_broker(base, timeout_s)
                    services = self._services(roles)
                    continue
                services()
                self._revive_teachers()
                if not roles.trainer.alive() and roles.trainer.proc.returncode != 0:
                    roles.trainer.check()
                time.sleep(1.0)
                if time.monotonic() - dashboard.refreshed > 3:  # its queries cost the sink CPU too
                    live.update(dashboard.refresh())
            if ended.proc.returncode == 0:
                # The last events (final step, evaluation) reach the store before the sinks stop.
                final = {"run": self.cfg.run_id, "step": self.cfg.max_steps}
                holder = LocalSink(base, next((s for s in roles.sinks if s.alive()), None))
                holder.wait_landed(FINAL_STEP, final, 1, "the final step", 60)
                time.sleep(2 * base.store.flush_interval_s + 1)
            live.update(dashboard.refresh())
        if ended.proc.returncode != 0:
            ended.check()
        return ended.proc.returncode

    def broker_full(self, base: Settings) -> bool:
        """The embedded broker this run started holds more than kafka.embedded_max_rss_mb, and
        the last handover (or the start) is kafka.embedded_handover_every_s behind."""
        kafka = base.kafka
        if self.broker is None or self.broker.pid is None:
            return False
        if time.monotonic() - self.handed_over < kafka.embedded_handover_every_s:
            return False
        rss = rss_bytes(self.broker.pid) or 0
        return rss > embedded_limit_bytes(kafka.embedded_max_rss_mb)

    def replace_broker(self, base: Settings, timeout_s: float) -> tuple[Settings, Roles]:
        """Give the embedded broker's memory back: every role stopped cleanly (each commits what
        it handled; the trainer saves its state), what is unfinished carried to a fresh broker
        (bus.broker_handover), every role started again on it, resuming. Nothing is lost or
        done twice; the pause is the roles' stop and start."""
        assert self.broker is not None and self.broker.pid is not None
        began = time.monotonic()
        rss = rss_bytes(self.broker.pid) or 0
        limit = embedded_limit_bytes(base.kafka.embedded_max_rss_mb)
        # bench/soak.py also hands over below the limit, at the minutes it is given.
        over = "over" if rss > limit else "asked to hand over below"
        self.console.print(
            f"the embedded broker holds {rss / MB:,.0f} MB, {over} kafka.embedded_max_rss_mb "
            f"({limit / MB:,.0f} MB): stopping the roles to hand what is unfinished to a fresh "
            "broker",
            markup=False,
        )
        self.health.hold()  # a client of the old broker too: nothing may be published meanwhile
        self.stop()
        self.processes = []
        old = base.kafka.bootstrap_servers or ""
        carried = Handover()

        def carry(address: str) -> None:
            nonlocal carried
            carried = asyncio.run(
                hand_over(base.kafka, base.kafka.model_copy(update={"bootstrap_servers": address}))
            )

        self.broker.replace(carry)
        new = self.broker.bootstrap_servers
        announce_moved(base, old, new)
        self.started = time.time()  # what the new broker acknowledges is counted anew
        kafka = base.kafka.model_copy(
            update={"bootstrap_servers": new, "ack_ledger": str(self.acks)}
        )
        base = base.model_copy(update={"kafka": kafka})
        self.health.move(base)  # held since the roles stopped: publishes on the new broker
        from rlbus.consumers.trainer.checkpoint import CheckpointStore  # torch: the train extra

        self.resume = CheckpointStore(self.cfg.checkpoint_url()).exists()
        roles = self._start_serving(base, timeout_s)
        self.handed_over = time.monotonic()
        paused = self.handed_over - began
        self.handovers.append((carried, paused))
        said = (
            f"{carried.carried:,} unfinished messages carried "
            f"({carried.carried_bytes / MB:,.1f} MB), {carried.left:,} left behind, "
            f"{carried.groups} consumer groups moved; the run paused {paused:.1f} s"
        )
        self.health.incident("broker-rotation", f"at {rss / MB:,.0f} MB: {said}")
        self.console.print(f"broker handed over: {said}", markup=False)
        return base, roles

    def stop(self, grace_s: float = KILL_AFTER_S) -> None:
        """Stop the roles in their order (ROLES' stop_rank, the processes of one rank together),
        each rank given `grace_s` to exit before what is left of it is killed, process trees
        whole. While the run is still starting (inference not serving yet: no task is out, no
        role has work another must see through), every role but the sinks is stopped at once and
        given STARTING_GRACE_S, then the sinks, the whole stop within STARTING_STOP_S. Another
        Ctrl-C or SIGTERM meanwhile kills every role left at once."""

        def stage(p: RoleProcess) -> int:
            return -1 if self.starting and p.role != "sink" else ROLES[p.role].stop_rank

        order = sorted(self.processes, key=stage)
        began = time.monotonic()
        try:
            for _, same in itertools.groupby(order, key=stage):
                group = list(same)
                for p in group:
                    p.terminate()
                if self.starting:
                    left = began + STARTING_STOP_S - time.monotonic()
                    deadline = time.monotonic() + min(grace_s, STARTING_GRACE_S, left)
                else:
                    deadline = time.monotonic() + grace_s
                for p in group:
                    p.wait_or_kill(deadline - time.monotonic())
        except KeyboardInterrupt:
            for p in self.processes:
                if p.alive():
                    p.kill()
            raise
