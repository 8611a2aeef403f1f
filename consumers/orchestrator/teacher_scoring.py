"""The orchestrator's distillation teachers (`opd`, `self-distill`): their URLs from the run
config, and scoring that waits for a teacher that does not answer yet (one started with the run
still loading, one `rlbus run` started again after it died) instead of failing the group."""

from __future__ import annotations

import asyncio
import logging
import time

from rlbus.clients.inference_client import InferenceClient, InferenceError
from rlbus.config.runs import RunConfig

log = logging.getLogger(__name__)

NEEDS_TEACHER = {"opd", "self-distill"}
TEACHER_WAIT_S = 900.0
"""How long a teacher may not answer: one started with the run loads its model meanwhile (as
inference loads the policy), one restarted loads it again."""
GONE = {502, 503}
"""InferenceError statuses of a teacher that is not there (unreachable) or not ready (loading)."""


def teacher_urls(cfg: RunConfig) -> dict[str, str]:
    """The teacher's /v1 URL of each environment whose algorithm needs one."""
    urls = {}
    for name, entry in cfg.envs.items():
        algo = entry.algorithm
        if algo.name not in NEEDS_TEACHER:
            continue
        if algo.teacher:
            raise ValueError(
                f"envs.{name}.algorithm.teacher = {algo.teacher!r} is served by `rlbus run`; "
                "an orchestrator started alone needs algorithm.teacher_url: serve the version "
                f"with `rlbus model export {algo.teacher} DIR --base BASE` and `rlbus worker "
                "inference --model DIR --frozen`"
            )
        url = algo.teacher_url or (cfg.inference.url if algo.name == "self-distill" else "")
        if not url:
            raise ValueError(
                f"envs.{name}: algorithm {algo.name!r} needs algorithm.teacher_url (or "
                "algorithm.teacher, a stored version `rlbus run` serves)"
            )
        urls[name] = url
    return urls


class PatientTeacher:
    """A teacher's client whose scoring waits, up to TEACHER_WAIT_S, through the teacher being
    gone or loading, then scores; any other error is the caller's."""

    def __init__(self, url: str, model: str | None = None):
        self.client = InferenceClient(url)
        self.model = model
        """The adapter the teacher is, on a server that serves several (teacher_model)."""

    async def score(
        self, prompt_ids: list[int], completion_ids: list[int], temperature: float
    ) -> list[float]:
        deadline = time.monotonic() + TEACHER_WAIT_S
        said = False
        while True:
            try:
                return await self.client.score(prompt_ids, completion_ids, temperature, self.model)
            except InferenceError as exc:
                if exc.status not in GONE or time.monotonic() > deadline:
                    raise
                if not said:
                    log.warning("the teacher does not answer (%s); waiting for it", exc)
                    said = True
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        await self.client.close()
