"""Following the `weights` topic: load each new WeightVersion, answer with WeightLoaded.

The bus consumer (worker.py) calls `on_weight_version` for every WeightVersion it receives
and publishes what it returns. Redeliveries are harmless: a version already served is not
loaded again, and its WeightLoaded gets the same derived event id, so the sink keeps one.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

from rlbus.consumers.inference.api import InferenceBackend
from rlbus.consumers.inference.checkpoint_reader import CheckpointError
from rlbus.schemas import WeightLoaded, WeightVersion, derived_id
from rlbus.schemas.weights_file import FORMATS

log = logging.getLogger(__name__)


def newest(events: Iterable[object], run_id: str | None = None) -> WeightVersion | None:
    """The highest WeightVersion among a polled batch (of `run_id`, if given): loading the
    intermediate ones would only delay the newest."""
    versions = [
        e for e in events if isinstance(e, WeightVersion) and (run_id is None or e.run_id == run_id)
    ]
    return max(versions, key=lambda e: e.version, default=None)


class WeightFollower:
    """Loads announced weights into one backend and names this worker in the acknowledgement."""

    def __init__(self, backend: InferenceBackend, worker_id: str, url: str = "") -> None:
        """`url`: the worker's /v1 URL as env producers reach it (announced with each load)."""
        self.backend = backend
        self.worker_id = worker_id
        self.url = url
        # A worker id outlives restarts (its consumer group resumes); a restarted worker's
        # loads are new events, so their ids name this process's start too.
        self.incarnation = uuid.uuid4().hex
        self.announced: WeightLoaded | None = None
        """What this follower published for the version it serves: a redelivery gets it back
        unchanged (the same id with another content would be a conflict)."""

    def _loaded(self, event: WeightVersion, load_s: float) -> WeightLoaded:
        self.announced = WeightLoaded(
            event_id=derived_id(
                "weight-loaded", self.worker_id, self.incarnation, event.run_id, event.version
            ),
            run_id=event.run_id,
            version=event.version,
            worker_id=self.worker_id,
            load_s=load_s,
            uri=event.uri,
            url=self.url,
        )
        return self.announced

    async def on_weight_version(self, event: WeightVersion) -> WeightLoaded | None:
        """Serve `event`'s weights from the next step; None when it is older than what is served."""
        if event.format not in FORMATS.values():
            raise CheckpointError(
                f"weights version {event.version} at {event.uri} is {event.format!r}; "
                f"one of {sorted(FORMATS.values())} is read"
            )
        served = self.backend.policy_version
        if event.version < served:
            log.info("skipping weights version %d: already serving %d", event.version, served)
            return None
        if event.version == served:
            if self.announced is not None and self.announced.version == served:
                return self.announced
            return self._loaded(event, 0.0)
        load_s = await self.backend.load_weights(event.uri, event.version)
        log.info(
            "serving weights version %d from %s (loaded in %.2fs)", event.version, event.uri, load_s
        )
        return self._loaded(event, load_s)
