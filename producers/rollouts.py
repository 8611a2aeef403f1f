"""Running a task's group of rollouts: each gets an interception session, a sandbox and the
harness; whatever happens, it ends as a RolloutCompleted (status "error" with the reason when
the harness crashed, timed out or its program broke a limit) plus its trace events.

Ids derive from the task event, so a redelivered task republishes the same ids and the store
keeps one copy."""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass

from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from rlbus.bus import telemetry
from rlbus.environment.loader import Environment
from rlbus.environment.taskset import RolloutHookError
from rlbus.producers.harnesses import Harness, HarnessError, Rollout, make_harness
from rlbus.producers.interception.calls import UpstreamError
from rlbus.producers.interception.server import InterceptionServer
from rlbus.producers.runtimes import Runtime, make_runtime
from rlbus.schemas import (
    Event,
    RolloutCompleted,
    TaskPublished,
    TokenRecord,
    TraceNode,
    derived_id,
    group_id_of,
)


@dataclass
class RolloutOutput:
    rollout: RolloutCompleted
    nodes: list[TraceNode]
    tokens: list[TokenRecord]
    context: Context | None = None
    """The rollout span's trace context (telemetry on): its events are published in it."""

    def events(self) -> list[Event]:
        """Trace first, rollout last: a consumer that sees the rollout can find its trace."""
        return [*self.nodes, *self.tokens, self.rollout]


def trace_parents(outputs: Iterable[RolloutOutput]) -> dict[str, Context | None] | None:
    """Each output's events by id, with its rollout's trace context (Bus.publish_many)."""
    if not telemetry.enabled():
        return None
    return {e.event_id: out.context for out in outputs for e in out.events()}


def rollout_id_of(group_id: str, run_id: str, sample_index: int) -> str:
    """A rollout's id: its group (the task event), the run producing it, and its sample."""
    return derived_id(group_id, run_id, "rollout", sample_index)


def _failure(exc: BaseException, timeout_s: float) -> tuple[str, str]:
    if isinstance(exc, (HarnessError, RolloutHookError)):
        return exc.kind, str(exc)
    if isinstance(exc, TimeoutError):
        return "timeout", f"rollout exceeded harness.timeout_s = {timeout_s:g}s"
    if isinstance(exc, UpstreamError):
        return "model", str(exc)
    tail = "".join(traceback.format_exception(exc, limit=-3)).strip()
    return "harness", f"{type(exc).__name__}: {exc}\n{tail}"


class RolloutRunner:
    def __init__(
        self,
        env: Environment,
        server: InterceptionServer,
        runtime: Runtime | None = None,
        harness: Harness | None = None,
    ):
        self.env = env
        self.server = server
        self.runtime = runtime or make_runtime(env.config.runtime)
        self.harness = harness or make_harness(env)
        self.slots = asyncio.Semaphore(env.config.max_concurrent_rollouts)

    async def run(
        self, task: TaskPublished, group_id: str, sample_index: int, group_size: int
    ) -> RolloutOutput:
        """One rollout, in a span of its own when telemetry is on (GenAI's invoke_agent: the
        harness is the agent; its model calls are children)."""
        rollout_id = rollout_id_of(group_id, task.run_id, sample_index)
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": self.env.id,
            "gen_ai.request.model": self.server.backend.model,
            "rlbus.rollout_id": rollout_id,
            "rlbus.group_id": group_id,
            "rlbus.task_id": task.task_id,
            "rlbus.sample_index": sample_index,
        }
        name = f"invoke_agent {self.env.id}"
        with telemetry.span(name, SpanKind.INTERNAL, attributes=attributes) as span:
            out = await self._run(task, rollout_id, group_id, sample_index, group_size)
            if span is not None:
                r = out.rollout
                span.set_attributes(
                    {
                        "gen_ai.usage.input_tokens": r.prompt_tokens,
                        "gen_ai.usage.output_tokens": r.completion_tokens,
                        "rlbus.status": r.status,
                        "rlbus.error_kind": r.error_kind,
                        "rlbus.num_turns": r.num_turns,
                        "rlbus.max_policy_version": r.max_policy_version,
                    }
                )
                out.context = telemetry.current()
        return out

    async def _run(
        self,
        task: TaskPublished,
        rollout_id: str,
        group_id: str,
        sample_index: int,
        group_size: int,
    ) -> RolloutOutput:
        env = self.env
        prompt = env.taskset.messages(task)
        status, kind, error, completion = "ok", "", "", []
        state: dict = {}
        timeout_s = env.config.harness.timeout_s
        async with self.slots:
            started = time.monotonic()
            with self.server.session(rollout_id, task.min_policy_version) as session:
                try:
                    async with self.runtime.sandbox(rollout_id) as sandbox:
                        rollout = Rollout(task, prompt, session, sandbox, env, state)
                        await env.taskset.prepare_rollout(rollout)
                        async with asyncio.timeout(timeout_s):
                            completion = await self.harness.run(rollout)
                        # In the same sandbox, before it closes: a verifier sees the agent's work.
                        await env.taskset.check_rollout(rollout)
                except Exception as exc:
                    status, (kind, error) = "error", _failure(exc, timeout_s)
                    completion = session.trace.completion()
                nodes, tokens = session.trace.events(group_id)
                usage = session.trace.usage()
        rollout_event = RolloutCompleted(
            event_id=derived_id(rollout_id, "completed"),
            run_id=task.run_id,
            rollout_id=rollout_id,
            group_id=group_id,
            task_id=task.task_id,
            env=env.id,
            sample_index=sample_index,
            group_size=group_size,
            prompt=prompt,
            completion=completion,
            answer=task.answer,
            info={**task.info, "state": state} if state else task.info,
            status=status,
            error=error,
            error_kind=kind,
            model=self.server.backend.model,
            harness=env.config.harness.kind,
            duration_s=time.monotonic() - started,
            tools=session.trace.tools,
            **usage,
        )
        for event in (*nodes, *tokens):
            event.run_id = task.run_id
        return RolloutOutput(rollout_event, nodes, tokens)

    async def run_group(self, task: TaskPublished) -> list[RolloutOutput]:
        size = task.group_size or self.env.config.group_size
        group_id = group_id_of(task)
        return list(await asyncio.gather(*(self.run(task, group_id, i, size) for i in range(size))))
