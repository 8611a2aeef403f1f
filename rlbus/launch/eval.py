"""`rlbus eval` as a library call: the embedded broker (unless one is configured), a sink
holding the store, an in-process evaluation pipeline, and the summary read back from the store
once every score has landed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rich.progress import TextColumn

from rlbus.bus import Bus
from rlbus.bus.store import open_store
from rlbus.bus.store.reads.eval_summary import SCORED
from rlbus.config import Settings
from rlbus.console import progress
from rlbus.discovery import local_broker
from rlbus.environment import Environment
from rlbus.launch.collector import steady_collector
from rlbus.launch.eval_pipeline import EvalPipeline, Tally
from rlbus.launch.eval_summary import (
    EvalSummary,
    latest_run,
    read_eval_summary,
    scored_tasks,
)
from rlbus.launch.local_sink import LocalSink, local_sink
from rlbus.producers.interception import InterceptionServer
from rlbus.producers.rollouts import RolloutRunner
from rlbus.schemas import TaskPublished, derived_id


class EvalError(RuntimeError):
    """An evaluation that cannot start or finish; the message says what to do."""


@dataclass
class EvalResult:
    run_id: str
    tally: Tally
    """This invocation's rollouts (a resumed run's earlier ones are only in `report`)."""
    report: EvalSummary
    skipped_tasks: int
    seconds: float
    """Wall time from the first rollout to the last score landing in the store."""


def _tasks(env: Environment, run_id: str, n: int, skip: set[str]) -> Iterator[TaskPublished]:
    for task in env.eval_tasks(run_id).take(n):
        if task.task_id in skip:
            continue
        # Stable per run and task, so a resumed or repeated run republishes the same ids.
        task.event_id = derived_id("eval-task", run_id, task.task_id)
        task.run_id = run_id
        yield task


async def _evaluate(
    settings: Settings,
    env: Environment,
    tasks: Iterator[TaskPublished],
    on_group: Callable[[Tally], None],
) -> Tally:
    async with (
        Bus.of(settings) as bus,
        InterceptionServer.of(env.config) as server,
    ):
        return await EvalPipeline(RolloutRunner(env, server), bus, on_group).run(tasks)


def _run_id(sink: LocalSink, env: Environment, run_id: str | None, resume: bool) -> str:
    if resume and run_id is None:
        with open_store(sink.settings.store.url, read_only=True) as store:
            run_id = latest_run(store, env.id, env.config.model.name)
        if run_id is None:
            raise EvalError(
                f"--resume: no earlier run of {env.id} with model {env.config.model.name!r} in "
                f"{sink.settings.store.url}; pass --run-id, or drop --resume to start one"
            )
    return run_id or f"eval-{env.id}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_eval(
    env: Environment,
    settings: Settings,
    *,
    n: int,
    run_id: str | None = None,
    resume: bool = False,
    pass_threshold: float = 1.0,
    scorer_version: str | None = None,
    store_timeout_s: float = 300,
    show_progress: bool = True,
) -> EvalResult:
    """Evaluate the first `n` tasks of `env`; returns once every score is in the store.
    `scorer_version`: the one the report reads (default: each rollout's newest score)."""
    with local_broker(settings) as (live, _), local_sink(live) as sink:
        run_id = _run_id(sink, env, run_id, resume)
        done: set[str] = set()
        if resume:
            with open_store(live.store.url, read_only=True) as store:
                done = scored_tasks(store, run_id, env.id)
        scope = {"run": run_id, "env": env.id}
        before = sink.count(SCORED, scope)
        if before and not resume:
            raise EvalError(
                f"run {run_id!r} already has {before:,} scored rollouts of {env.id} in "
                f"{live.store.url}: pass --resume to continue it, or another --run-id"
            )
        live = live.model_copy(update={"run_id": run_id})
        fields = (
            TextColumn("errors {task.fields[errors]}"),
            TextColumn("reward {task.fields[reward]:.3f}"),
        )
        started = time.monotonic()
        with progress(*fields, disable=not show_progress) as bars:
            total = max(0, n - len(done)) * env.config.group_size
            bar = bars.add_task(f"{env.id} ({run_id})", total=total, errors=0, reward=0.0)

            def on_group(tally: Tally) -> None:
                bars.update(
                    bar, completed=tally.rollouts, errors=tally.errors, reward=tally.mean_reward
                )

            with steady_collector():
                tasks = _tasks(env, run_id, n, done)
                tally = asyncio.run(_evaluate(live, env, tasks, on_group))
            expected = before + tally.rollouts
            landed = bars.add_task("in ClickHouse", total=expected, errors="", reward=0.0)
            sink.wait_landed(
                SCORED,
                scope,
                expected,
                f"{tally.rollouts} scores of run {run_id} in the store",
                store_timeout_s,
                on_count=lambda count: bars.update(landed, completed=count),
            )
        seconds = time.monotonic() - started
        with open_store(live.store.url, read_only=True) as store:
            try:
                report = read_eval_summary(store, run_id, env.id, pass_threshold, scorer_version)
            except KeyError as exc:
                raise EvalError(exc.args[0]) from None
    return EvalResult(run_id, tally, report, len(done), seconds)
