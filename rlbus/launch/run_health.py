"""A local run's health over time, for whoever watches it in `rlbus ui` or `rlbus report` rather
than in its logs: every health.sample_every_s, each process's resident memory (the embedded
broker's too) and each of the run's consumer groups' lag, as a HealthSample; and each incident
(a role exited or restarted, the broker rotated), as a RunIncident when it happens. Both travel
on the `health` topic and the sink stores them like any event.

`rlbus run`'s supervisor is plain blocking code, so this publishes from a thread of its own,
with its own event loop and bus. Nothing here may stop a run: a sample or a publish that fails
is logged once (per kind of failure) and the next one is tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.lag import Lag
from rlbus.config import Settings
from rlbus.config.runs import HealthConfig
from rlbus.consumers.sink.sink import GROUP as SINK_GROUP
from rlbus.launch.processes import RoleProcess, rss_bytes
from rlbus.schemas import Event, HealthSample, RunIncident

log = logging.getLogger(__name__)

WAIT_S = 10.0
"""Longest wait for one sample's lag or one publish: a broker that is away (being rotated) holds
up the next sample by that much at most, and never the run."""
RETRY_S = 5.0
"""Between attempts to open the bus, when the broker did not answer."""
STOP_S = 15.0
"""How long stop() waits for what is pending to be published and the bus to close."""
MIB = 1024 * 1024


def run_processes(
    processes: Iterable[RoleProcess], broker: EmbeddedBroker | None
) -> dict[str, int]:
    """A local run's processes now, pid by name (env, env-2), its embedded broker's as "broker"."""
    pids = {p.name: p.proc.pid for p in processes}
    if broker is not None and broker.pid is not None:
        pids["broker"] = broker.pid
    return pids


def memory_mib(pids: Mapping[str, int]) -> dict[str, float]:
    """Resident memory by name, in MiB, of the processes still alive."""
    found = {name: rss_bytes(pid) for name, pid in pids.items()}
    return {name: round(rss / MIB, 1) for name, rss in found.items() if rss is not None}


def serves(run_id: str) -> Callable[[str], bool]:
    """Whether a consumer group (its name without the prefix) works for the run: one of its own
    (ROLE.RUN or ROLE.RUN.PART: schemas.group_of), or the sink's, which stores every run."""

    def wanted(group: str) -> bool:
        rest = group.partition(".")[2]
        return group == SINK_GROUP or rest == run_id or rest.startswith(f"{run_id}.")

    return wanted


@contextlib.asynccontextmanager
async def opened(settings: Settings) -> AsyncIterator[tuple[Bus, Lag]]:
    """A bus and a lag reader on `settings`' broker, closed however far opening them got (a
    broker that does not answer fails their start, and they are retried)."""
    bus, lag = Bus.of(settings), Lag(settings.kafka)
    try:
        await bus.start()
        await lag.__aenter__()
        yield bus, lag
    finally:
        await lag.__aexit__()
        await bus.stop()


class RunHealth:
    """Publishes a run's health samples and incidents while it runs, from its own thread.
    `incident()` may be called from any thread at any time: what comes before `start()` goes
    out once it has started."""

    def __init__(
        self, run_id: str, config: HealthConfig, processes: Callable[[], Mapping[str, int]]
    ):
        self.run_id = run_id
        self.every_s = config.sample_every_s
        self.processes = processes
        """The run's processes now, pid by name: read at each sample, as roles restart and the
        broker rotates."""
        self._settings: Settings | None = None
        """Where to publish: the run's broker now (None: held, during a handover)."""
        self._pending: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._said: set[str] = set()

    def incident(self, incident: str, detail: str = "", process: str = "") -> None:
        """Record that `incident` ("broker-rotation", "role-exited", "role-restarted", "teacher":
        a distillation teacher served) happened
        to the run now; `detail` says it for a person, `process` names the process it happened
        to (env-2; '' for the run as a whole). Returns at once; the health thread publishes it."""
        event = RunIncident(run_id=self.run_id, incident=incident, detail=detail, process=process)
        self._pending.put(event)
        self._nudge()

    def start(self, settings: Settings) -> None:
        """Publish on `settings`' broker (as the run's roles do) until stop()."""
        self._settings = settings
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._publish(),), name="rlbus-health", daemon=True
        )
        self._thread.start()

    def hold(self) -> None:
        """Publish nothing until move(): the run's broker is about to be handed over. The bus
        closes while the old broker still answers (its acknowledgements go into that broker's
        ledger), so the handover's pause brings no failed publish and no client errors;
        incidents meanwhile wait, and no sample is taken."""
        self._settings = None
        self._nudge()

    def move(self, settings: Settings) -> None:
        """Publish on `settings`' broker from now on (the new one, after a handover); what is
        pending goes out there."""
        self._settings = settings
        self._nudge()

    def wind_down(self) -> None:
        """Begin stop(): publish what is pending and close the bus meanwhile (while the run's
        roles stop), so that stop() itself waits little."""
        self._stopping.set()
        self._nudge()

    def stop(self, timeout_s: float = STOP_S) -> None:
        """Publish what is pending, close the bus (its acknowledgements go into the run's ack
        ledger, as every role's do) and end the thread, within `timeout_s`."""
        self.wind_down()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _nudge(self) -> None:
        """Wake the health thread (an incident to publish, or stop)."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop has just closed
                loop.call_soon_threadsafe(wake.set)

    def _once(self, what: str, message: str) -> None:
        if what not in self._said:
            self._said.add(what)
            log.warning("run health: %s (said once; the run goes on)", message)

    async def _publish(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        wanted = serves(self.run_id)
        due = time.monotonic()
        while not self._stopping.is_set():
            settings = self._settings
            if settings is None:
                await self._wait(None)  # held: until move() or stop()
                continue
            try:
                async with opened(settings) as (bus, lag):
                    while not self._stopping.is_set() and self._settings is settings:
                        events = self._drain()
                        if self.every_s and time.monotonic() >= due:
                            due = time.monotonic() + self.every_s
                            events.append(await self._sample(lag, wanted))
                        await self._send(bus, events)
                        await self._wait(due if self.every_s else None)
                    if self._stopping.is_set():
                        await self._send(bus, self._drain())  # what came with the stop
            except Exception as exc:  # the broker is away: try again, the run goes on
                self._once("bus", f"cannot reach the broker ({exc!r}); retrying")
                await self._wait(time.monotonic() + RETRY_S)

    def _drain(self) -> list[Event]:
        events: list[Event] = []
        with contextlib.suppress(queue.Empty):
            while True:
                events.append(self._pending.get_nowait())
        return events

    async def _sample(self, lag: Lag, wanted: Callable[[str], bool]) -> HealthSample:
        try:
            memory = memory_mib(self.processes())
        except Exception as exc:
            self._once("memory", f"no memory sample ({exc!r})")
            memory = {}
        try:
            behind = await asyncio.wait_for(lag.groups(wanted), WAIT_S)
        except Exception as exc:
            self._once("lag", f"no consumer lag sample ({exc!r})")
            behind = {}
        return HealthSample(run_id=self.run_id, rss_mib=memory, lag=behind)

    async def _send(self, bus: Bus, events: list[Event]) -> None:
        """Publish; on failure a sample is dropped (the next one follows) and an incident kept
        for the next attempt."""
        if not events:
            return
        try:
            await asyncio.wait_for(bus.publish_many(events), WAIT_S)
        except Exception as exc:
            self._once("publish", f"could not publish ({exc!r})")
            for event in events:
                if isinstance(event, RunIncident):
                    self._pending.put(event)

    async def _wait(self, until: float | None) -> None:
        """Until `until` (time.monotonic(); None: no sample is due), an incident, or stop."""
        assert self._wake is not None
        timeout = None if until is None else max(0.0, until - time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()
