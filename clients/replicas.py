"""Several inference servers behind one run: what each announced (`Roster`) and which one
answers a rollout's calls (`Replicas`).

Every inference worker publishes a WeightLoaded with its /v1 URL when it loads a version and
re-publishes it while it serves (consumers.heartbeat): the repeats tell that it is alive. The
roster keeps, per replica, the version it serves and when it was last heard; the orchestrator
counts a version as served once enough live replicas serve it (`Roster.served`).

Env producers route with `Replicas`, as prime-rl's orchestrator spreads rollouts over a list of
vLLM servers and exposes only servers ready with the current weights, with two differences that
the bus makes cheap: a rollout stays on one replica for all its turns (its prompt prefix is in
that replica's cache), and replicas are chosen by outstanding requests rather than in turn.
A replica behind the version a task asks for is skipped while another serves it (when none
does, the freshest answers: its tokens carry their exact version and the orchestrator's
staleness rule decides). A call whose replica is unreachable, broke off, or is still catching up
(503) is made again on another replica, and counted; `Route.failures` says where it failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TypeVar

from rlbus.clients.inference_client import InferenceClient, InferenceError
from rlbus.clients.token_api import Delta, GenerateResult, SamplingParams
from rlbus.config import KafkaConfig
from rlbus.schemas import WeightLoaded

T = TypeVar("T")
log = logging.getLogger(__name__)

LIVE_ANNOUNCEMENTS = 3
"""A replica not heard from for this many announcement periods is taken for gone."""
RETRIED_STATUSES = frozenset({502, 503})
"""Failures another replica may not have: unreachable or broke off (502), catching up (503)."""
DOWN_S = 2.0
"""A replica that failed a call is passed over this long before it is tried again."""


def normal_url(url: str) -> str:
    return url.rstrip("/")


@dataclass
class ReplicaAnnouncement:
    """What one replica last said of itself."""

    url: str
    worker_id: str
    version: int
    heard_at: float
    """Unix seconds when the broker took its latest announcement."""


class Roster:
    """The run's inference replicas as their announcements describe them."""

    def __init__(self, announce_every_s: float = KafkaConfig().announce_every_s):
        """`announce_every_s`: how often replicas re-announce (kafka.announce_every_s)."""
        self.ttl_s = LIVE_ANNOUNCEMENTS * announce_every_s
        self.replicas: dict[str, ReplicaAnnouncement] = {}
        """By worker id."""

    def heard(self, loaded: WeightLoaded, at: float) -> None:
        """`loaded` was published (again) at `at`: the worker serves that version now, unless
        a later announcement of it was heard already (the same one may come by two ways)."""
        known = self.replicas.get(loaded.worker_id)
        if known is not None and at < known.heard_at:
            return
        self.replicas[loaded.worker_id] = ReplicaAnnouncement(
            normal_url(loaded.url), loaded.worker_id, loaded.version, at
        )

    def live(self, now: float | None = None) -> list[ReplicaAnnouncement]:
        now = time.time() if now is None else now
        return [r for r in self.replicas.values() if now - r.heard_at <= self.ttl_s]

    def version_of(self, url: str, now: float | None = None) -> int | None:
        """What the live replica at `url` serves; None when it has not said (or not lately)."""
        versions = [r.version for r in self.live(now) if r.url == url]
        return max(versions) if versions else None

    def serving(self, version: int, now: float | None = None) -> int:
        """How many live replicas serve `version` or a newer one."""
        return sum(r.version >= version for r in self.live(now))

    def served(self, quorum: int = 0, now: float | None = None) -> int | None:
        """The newest version at least `quorum` live replicas serve (0: every live replica);
        when fewer are live, every live one. None while no replica is live."""
        versions = sorted((r.version for r in self.live(now)), reverse=True)
        if not versions:
            return None
        needed = min(quorum or len(versions), len(versions))
        return versions[needed - 1]


@dataclass
class StartingReplicas:
    """The replicas a run has from its start (configured, or started for it) and how long a new
    run's first tasks wait for all of them once one serves the initial weights. prime-rl's
    orchestrator checks every server's health before its first rollouts; here the wait is
    bounded, so one replica that never comes up does not stall the run (it joins when it
    announces itself)."""

    expected: int = 1
    wait_s: float = 120.0
    first_up_at: float | None = None
    """Monotonic seconds when a replica first served the version the run starts from."""

    def all_up(self, roster: Roster, version: int, now: float | None = None) -> bool:
        """Whether the first tasks may go: `expected` live replicas serve `version`, or
        `wait_s` passed since the first did (then the run goes on with those, and says so)."""
        now = time.monotonic() if now is None else now
        up = roster.serving(version)
        if up >= self.expected:
            return True
        if self.first_up_at is None:
            self.first_up_at = now
        if now - self.first_up_at < self.wait_s:
            return False
        log.warning(
            "%d of the run's %d inference replicas serve version %d after %gs "
            "(inference.start_wait_s): starting with those; the others join when they "
            "announce themselves",
            up,
            self.expected,
            version,
            self.wait_s,
        )
        return True


@dataclass
class Route:
    """One rollout's way to inference: the version its task asks for and the replica that has
    answered it so far."""

    min_version: int = 0
    replica: str | None = None
    failures: list[tuple[str, str]] = field(default_factory=list)
    """(replica, error) of each attempt that failed and was made again elsewhere; the caller
    takes them (`taken_failures`) to record with the call."""

    def taken_failures(self) -> list[tuple[str, str]]:
        taken, self.failures = self.failures, []
        return taken


class NoReplica(InferenceError):
    """No inference replica of the run is known, or every one failed."""


class Replicas:
    """Calls to whichever replica a rollout's route picks, made again on another when that one
    fails. `urls`: replicas given by configuration (they need not have announced); announced
    ones join as they are heard (`roster`)."""

    def __init__(
        self,
        urls: Iterable[str],
        roster: Roster,
        timeout_s: float = 600,
        wait_s: float = 60,
    ):
        """`wait_s`: how long a call waits for a replica to be known at all (a run's replicas
        announce themselves once their weights are loaded)."""
        self.configured = [normal_url(u) for u in urls]
        self.roster = roster
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self.clients: dict[str, InferenceClient] = {}
        self.outstanding: Counter[str] = Counter()
        self.down_until: dict[str, float] = {}
        self.retried = 0
        """Calls made again on another replica after one failed."""
        self.behind = 0
        """Calls that went to a replica behind their task's version (no replica served it)."""

    def known(self) -> list[str]:
        """Configured replicas, then announced ones still heard from."""
        announced = [r.url for r in self.roster.live() if r.url]
        return list(dict.fromkeys([*self.configured, *announced]))

    def _usable(self, url: str, now: float) -> bool:
        return self.down_until.get(url, 0.0) <= now

    def pick(self, route: Route, tried: Iterable[str] = ()) -> str | None:
        """The replica for the route's next call: its own while that one is usable and not
        behind; else the usable replica serving the task's version with the fewest requests
        outstanding (the fresher on a tie); else the freshest usable one. None: none usable."""
        now = time.monotonic()
        usable = [u for u in self.known() if u not in tried and self._usable(u, now)]
        if not usable:
            return None

        def version(url: str) -> int:
            served = self.roster.version_of(url)
            # A configured replica that has not announced is taken at its word: usable.
            return route.min_version if served is None else served

        current = [u for u in usable if version(u) >= route.min_version]
        if route.replica in current:
            return route.replica
        if current:
            return min(current, key=lambda u: (self.outstanding[u], -version(u)))
        self.behind += 1
        return max(usable, key=lambda u: (version(u), -self.outstanding[u]))

    def client(self, url: str) -> InferenceClient:
        if url not in self.clients:
            self.clients[url] = InferenceClient(url, self.timeout_s)
        return self.clients[url]

    async def _choose(self, route: Route) -> str:
        """The route's replica, waiting up to `wait_s` while none is known or usable (a run's
        replicas announce themselves once their weights are loaded; a failed one is passed over
        for DOWN_S)."""
        deadline = time.monotonic() + self.wait_s
        while (url := self.pick(route)) is None:
            if time.monotonic() >= deadline:
                known = ", ".join(self.known()) or "none configured or announced"
                raise NoReplica(
                    f"no inference replica usable after {self.wait_s:g}s ({known})", 503
                )
            await asyncio.sleep(0.2)
        return url

    def _again(self, route: Route, url: str, exc: InferenceError, tried: list[str]) -> str:
        """Where a call that failed on `url` is made again; raises `exc` when it may not be
        (an error of the request itself, or no other replica usable now)."""
        if exc.status not in RETRIED_STATUSES:
            raise exc
        self.down_until[url] = time.monotonic() + DOWN_S
        route.replica = None
        other = self.pick(route, tried)
        if other is None:
            raise exc
        route.failures.append((url, str(exc)))
        self.retried += 1
        return other

    async def call(
        self, route: Route, request: Callable[[InferenceClient], Awaitable[T]]
    ) -> tuple[T, str]:
        """`request` made on the route's replica, and on others while it fails in a way another
        may not (RETRIED_STATUSES); returns its answer and the replica that gave it."""
        tried = [await self._choose(route)]
        while True:
            url = tried[-1]
            self.outstanding[url] += 1
            try:
                answer = await request(self.client(url))
            except InferenceError as exc:
                tried.append(self._again(route, url, exc, tried))
                continue
            finally:
                self.outstanding[url] -= 1
            route.replica = url
            return answer, url

    async def stream(
        self, route: Route, prompt_ids: list[int], sampling: SamplingParams
    ) -> AsyncIterator[tuple[Delta | GenerateResult, str]]:
        """A streamed generate, each item with the replica it came from. Made again elsewhere
        only until its first item: what was sampled and handed on cannot be taken back."""
        tried = [await self._choose(route)]
        while True:
            url = tried[-1]
            self.outstanding[url] += 1
            started = False
            try:
                async with aclosing(
                    self.client(url).generate_stream(prompt_ids, sampling)
                ) as items:
                    async for item in items:
                        started = True
                        yield item, url
                route.replica = url
                return
            except InferenceError as exc:
                if started:
                    raise
                tried.append(self._again(route, url, exc, tried))
            finally:
                self.outstanding[url] -= 1

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()
        self.clients.clear()
