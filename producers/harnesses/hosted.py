"""The harness of an environment hosted in a venv of its own (environment/hosted/): its worker
plays the rollout whole (`episode`: a verifiers V1 task set, its own harness pointed at this
rollout's interception URL), or rlbus's chat loop plays it with the environment answering each
reply (`steps`: OpenEnv's reset/step, a TextArena game). Either way every model call goes
through the rollout's session, so tokens, log-probs and policy versions are recorded as for a
native task set; what the environment reports (reward, its parts, metrics, stop reason) goes
into the rollout's state for the judge."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from rlbus.config.env import HarnessConfig
from rlbus.environment.hosted.venv_taskset import STATE, HostedTaskSet
from rlbus.environment.hosted.worker import HostedWorker, HostedWorkerError
from rlbus.producers.harnesses.base import HarnessError, Rollout
from rlbus.producers.harnesses.chat_loop import ChatHarness
from rlbus.schemas import Messages
from rlbus.schemas.chat import text_of

CLOSE_S = 10
"""How long a failed episode's close may take before the rollout's own error is reported."""


def _row(rollout: Rollout) -> dict[str, Any]:
    task = rollout.task
    return {"prompt": rollout.prompt, "answer": task.answer, "info": task.info}


class EnvironmentTurns:
    """The environment as the user simulator: each model reply is its action, the observation
    it returns the next user turn; a finished episode ends the conversation."""

    def __init__(self, worker: HostedWorker, session: str):
        self.worker = worker
        self.session = session

    async def reply(self, rollout: Rollout, messages: Messages, turn: int) -> str | None:
        action = text_of(messages[-1].get("content")) if messages else ""
        result = await self.worker.acall("step", session=self.session, action=action)
        if result.get("done") or result.get("observation") is None:
            return None
        return str(result["observation"])


class HostedHarness:
    def __init__(self, taskset: HostedTaskSet, config: HarnessConfig):
        self.taskset = taskset
        self.config = config

    async def run(self, rollout: Rollout) -> Messages:
        try:
            if self.taskset.mode == "episode":
                return await self._episode(rollout)
            return await self._steps(rollout)
        except HostedWorkerError as exc:
            raise HarnessError("environment", str(exc)) from None

    async def _episode(self, rollout: Rollout) -> Messages:
        session = rollout.session
        endpoint = {"base_url": session.base_url, "model": session.server.backend.model}
        reported = await self.taskset.worker.acall("rollout", task=_row(rollout), endpoint=endpoint)
        rollout.state[STATE] = reported
        if reported.get("error"):
            raise HarnessError("environment", f"{self.taskset.spec}: {reported['error']}")
        return session.trace.completion()

    async def _steps(self, rollout: Rollout) -> Messages:
        worker = self.taskset.worker
        key = uuid.uuid4().hex
        await worker.acall("reset", session=key, task=_row(rollout))
        try:
            completion = await ChatHarness(self.config, EnvironmentTurns(worker, key)).run(rollout)
        except BaseException:
            # The episode's own failure is the rollout's (a timeout stays a timeout): closing
            # is only tidying, and may fail too when the worker is what broke.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(worker.acall("close", session=key), CLOSE_S)
            raise
        rollout.state[STATE] = await worker.acall("close", session=key)
        return completion
