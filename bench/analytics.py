"""Analytics at scale: the views and the `rlbus ui` pages over a large store, each next to the
same data's plain SQL in chdb, in one run.

1. fill: N rollouts (default 1,000,000) in three runs (two trained, one evaluated), each with
   its task, score, trace nodes (system, user, model turns, tool results, a few sub-agent
   branches) and token records (prompt and completion ids, log-probs, versions, call times),
   plus train steps, weight versions, batches and dead letters, all through the sink's own
   insert path (`Store.insert_events`, blocks of `--block` rows); then the store's bytes per
   rollout.
2. views: each view, read as the ui reads it (one run), vs a plain query an analyst would
   write over the base tables for the same figures (checked equal).
3. ui pages: `rlbus ui` in its own process reads the store through this process's endpoint (as
   while a run holds it); each page's response time vs the plain SQL that fetches the same data
   in this process. Browser load (headless chromium through the `test` extra's Playwright:
   request to load event) is printed too.

Every figure is the p95 of `--repeat` timings; a ratio is a p95 over its baseline's p95. Last
line: RESULT ui_vs_sql_p95=<worst page's ratio> views_vs_sql_p95=<worst view's ratio>
(goals <= 2.0 and <= 1.5).

    python bench/analytics.py [--rollouts 1000000] [--repeat 10] [--store DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from rlbus.bus.store import Store, open_store
from rlbus.schemas import (
    DeadLetter,
    Event,
    RolloutCompleted,
    RolloutScored,
    TaskPublished,
    TokenRecord,
    TraceNode,
    TrainBatch,
    TrainStep,
    WeightLoaded,
    WeightVersion,
    derived_id,
    group_id_of,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/support
from support.browser import BrowserMissing, chromium_page, timing
from support.browser import Page as BrowserPage

console = Console()
GROUP = 8
ROLLOUTS_PER_STEP = 1024
RUNS = (("train-a", 0.4, True), ("train-b", 0.4, True), ("eval-c", 0.2, False))
"""(run, share of the rollouts, trained)."""
ERROR_KINDS = ("timeout", "sandbox", "harness")
RARE_WORD = "zebra"
"""In about one completion in a thousand: what the text filter looks for."""


# -- fill --------------------------------------------------------------------------------


@dataclass
class Pool:
    """Random token ids and log-probs to slice from, so a rollout costs no random calls."""

    rng: np.random.Generator
    ids: np.ndarray = field(init=False)
    lps: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.ids = self.rng.integers(0, 32_000, 4_000_000, dtype=np.uint32)
        self.lps = np.log(self.rng.random(4_000_000, dtype=np.float32) * 0.98 + 0.02)

    def take(self, n: int) -> tuple[bytes, bytes]:
        at = int(self.rng.integers(0, len(self.ids) - n))
        return self.ids[at : at + n].tobytes(), self.lps[at : at + n].tobytes()


def rollout_events(
    run: str, i: int, version: int, task: TaskPublished, prompt_ids: bytes, pool: Pool
) -> list[Event]:
    """One rollout's events as an env producer and a judge publish them."""
    rng = pool.rng
    rollout = derived_id(run, "rollout", i)
    ts = 1.75e9 + i * 0.05
    turns = 1 if rng.random() < 0.7 else int(rng.integers(2, 4))
    nodes: list[TraceNode] = []
    records: list[TokenRecord] = []

    def node(
        role: str,
        message: dict,
        ids: bytes,
        parent: str,
        sampled: bool,
        call: int = -1,
        branch: str = "main",
    ) -> str:
        node_id = derived_id(rollout, "node", len(nodes))
        nodes.append(
            TraceNode(
                run_id=run,
                ts=ts,
                node_id=node_id,
                rollout_id=rollout,
                parent_id=parent,
                branch_id=branch,
                index=len(nodes),
                role=role,
                message=message,
                token_ids=ids,
                sampled=sampled,
                call_index=call,
            )
        )
        return node_id

    system = node("system", {"role": "system", "content": "Solve the task."}, b"", "", False)
    tip = node("user", task.prompt[-1], prompt_ids, system, False)
    context = len(prompt_ids) // 4
    completion: list[dict] = []
    model_s = 0.0
    branches = [("main", tip)] + ([("b1", tip)] if rng.random() < 0.02 else [])
    call = 0
    for branch, start in branches:
        tip = start
        for turn in range(turns if branch == "main" else 1):
            n = int(rng.integers(8, 48))
            ids, lps = pool.take(n)
            word = RARE_WORD if rng.random() < 0.001 else "answer"
            tool = branch == "main" and turn < turns - 1
            message: dict[str, Any] = {"role": "assistant", "content": f"my {word} {i}"}
            if tool:
                message["tool_calls"] = [
                    {
                        "id": f"c{turn}",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"q": 1}'},
                    }
                ]
            seconds = float(rng.lognormal(-1.5, 0.6))
            model_s += seconds
            records.append(
                TokenRecord(
                    run_id=run,
                    ts=ts - 0.1 * (turns - turn),
                    rollout_id=rollout,
                    group_id=group_id_of(task),
                    call_index=call,
                    model="policy",
                    prompt_ids=pool.take(context)[0],
                    completion_ids=ids,
                    logprobs=lps,
                    policy_version=version,
                    finish_reason="tool_calls" if tool else "stop",
                    duration_s=seconds,
                )
            )
            tip = node("assistant", message, ids, tip, True, call, branch)
            call += 1
            context += n
            if branch == "main":
                completion.append(message)
            if tool:
                result = {"role": "tool", "tool_call_id": f"c{turn}", "content": "42"}
                tip = node("tool", result, pool.take(6)[0], tip, False, -1, branch)
                completion.append(result)
                context += 6
    failed = rng.random() < 0.03
    correct = rng.random() < 0.2 + 0.5 * min(1.0, version / 400)
    common = {
        "run_id": run,
        "rollout_id": rollout,
        "group_id": group_id_of(task),
        "task_id": task.task_id,
        "env": task.env,
        "sample_index": i % GROUP,
        "group_size": GROUP,
    }
    completed = RolloutCompleted(
        ts=ts,
        **common,
        prompt=task.prompt,
        completion=completion,
        answer=task.answer,
        info=task.info,
        status="error" if failed else "ok",
        error="it broke" if failed else "",
        error_kind=ERROR_KINDS[i % 3] if failed else "",
        model="policy",
        harness="tools",
        num_turns=call,
        prompt_tokens=context - sum(len(r.completion_ids) // 4 for r in records),
        completion_tokens=sum(len(r.completion_ids) // 4 for r in records),
        min_policy_version=version,
        max_policy_version=version,
        duration_s=model_s + float(rng.lognormal(-3, 1)),
    )
    scored = RolloutScored(
        ts=ts + 0.01,
        **common,
        reward=0.0 if failed else float(correct),
        rewards={"exact": float(correct), "partial": float(rng.random())},
        metrics={"chars": float(rng.integers(5, 80))},
        status="error" if failed else "ok",
        policy_version=version,
        completion_tokens=completed.completion_tokens,
    )
    return [completed, scored, *nodes, *records]


def run_events(run: str, first: int, count: int, trained: bool, pool: Pool) -> Iterator[Event]:
    """A run's events in the order a run makes them, a group at a time."""
    steps = count // ROLLOUTS_PER_STEP if trained else 0
    for g in range(count // GROUP):
        i0 = first + g * GROUP
        split = "test" if g % 20 == 0 else "train"
        task = TaskPublished(
            run_id=run,
            ts=1.75e9 + i0 * 0.05,
            task_id=f"task-{g % 50_000}",
            env="puzzles",
            prompt=[{"role": "user", "content": f"Solve puzzle {g % 50_000}."}],
            answer=str(g % 97),
            info={"split": split},
            group_size=GROUP,
            split=split,
        )
        yield task
        prompt_ids = pool.take(int(pool.rng.integers(40, 120)))[0]
        version = min(steps, (g * GROUP) // ROLLOUTS_PER_STEP) if trained else 0
        for i in range(i0, i0 + GROUP):
            behind = int(pool.rng.integers(0, 3)) if trained else 0
            yield from rollout_events(run, i, max(0, version - behind), task, prompt_ids, pool)
    for step in range(1, steps + 1):
        ts = 1.75e9 + (first + step * ROLLOUTS_PER_STEP) * 0.05
        hist = {"0": 700, "1": 250, "2": 70, "3": 4}
        yield TrainStep(
            run_id=run,
            ts=ts,
            step=step,
            loss=1 / step,
            grad_norm=1.0,
            entropy=2.0,
            lr=3e-4,
            num_samples=1024,
            num_tokens=40_000,
            tokens_per_s=52_000.0,
            dropped_stale=4,
            staleness=hist,
        )
        yield TrainBatch(
            run_id=run,
            ts=ts - 1,
            batch_id=derived_id(run, "batch", step),
            step=step - 1,
            num_tokens=40_000,
            dropped_stale=4,
            metrics={"dropped_zero_signal": 12.0, "dropped_too_long": 1.0},
        )
        yield WeightVersion(run_id=run, ts=ts, version=step, step=step, uri=f"file:///w/{step}")
        yield WeightLoaded(run_id=run, ts=ts + 1, version=step, worker_id="w0", load_s=0.2)
    for n in range(count // 5000):
        yield DeadLetter(
            run_id=run,
            origin_topic="tasks",
            origin_partition=0,
            origin_offset=n,
            consumer_group="env",
            error="decode: bad",
        )


def fill(store: Store, total: int, block: int) -> float:
    """Insert every run's events in blocks per kind, as the sink does; returns seconds."""
    pool = Pool(np.random.default_rng(0))
    pending: dict[type, list[Event]] = {}
    offsets: dict[type, int] = {}
    started = time.perf_counter()
    done = 0

    def flush(kind: type) -> None:
        events = pending.pop(kind, [])
        if not events:
            return
        at = offsets.get(kind, 0)
        store.insert_events(
            events, [(0, at + k) for k in range(len(events))], f"bench-{kind.table}-{at}"
        )
        offsets[kind] = at + len(events)

    first = 0
    for run, share, trained in RUNS:
        count = int(total * share) // GROUP * GROUP
        for event in run_events(run, first, count, trained, pool):
            batch = pending.setdefault(type(event), [])
            batch.append(event)
            if len(batch) >= block:
                flush(type(event))
                if type(event) is RolloutCompleted:
                    done += block
                    rate = done / (time.perf_counter() - started)
                    console.print(f"  {done:,} rollouts stored ({rate:,.0f}/s)", end="\r")
        first += count
    for kind in list(pending):
        flush(kind)
    console.print()
    return time.perf_counter() - started


def bytes_per_rollout(store: Store) -> tuple[float, list[tuple[str, int, int]]]:
    tables = store.query(
        "SELECT table, sum(rows), sum(bytes_on_disk) FROM system.parts "
        "WHERE active AND database = currentDatabase() GROUP BY table ORDER BY 3 DESC"
    ).rows
    rollouts = store.query("SELECT count() FROM rollouts").rows[0][0]
    return sum(t[2] for t in tables) / rollouts, [(str(a), int(b), int(c)) for a, b, c in tables]


# -- timing ------------------------------------------------------------------------------


def settle(store: Store, timeout_s: float = 900) -> float:
    """Wait for background merges to finish (a store at rest, as analytics usually meet it)."""
    started = time.perf_counter()
    while store.query("SELECT count() FROM system.merges").rows[0][0]:
        if time.perf_counter() - started > timeout_s:
            break
        time.sleep(1)
    return time.perf_counter() - started


def p95(samples: list[float]) -> float:
    return float(np.percentile(samples, 95))


def paired(
    ours: Callable[[], Any], baseline: Callable[[], Any], repeat: int
) -> tuple[float, float, Any, Any]:
    """p95 seconds of each, timed in turns (so both meet the same load on a shared machine),
    after one warm-up; quick ones get more turns (up to 5x) so a p95 means something. Returns
    the p95s and each one's last result."""
    start = time.perf_counter()
    a, b = ours(), baseline()
    turns = min(5 * repeat, max(repeat, math.ceil(2.0 / max(time.perf_counter() - start, 1e-3))))
    ours_s, base_s = [], []
    for turn in range(turns):
        for action, samples in ((ours, ours_s), (baseline, base_s))[:: 1 if turn % 2 else -1]:
            t0 = time.perf_counter()
            result = action()
            samples.append(time.perf_counter() - t0)
            if action is ours:
                a = result
            else:
                b = result
    return p95(ours_s), p95(base_s), a, b


RUN = {"run": "train-a"}
VIEWS: dict[str, tuple[str, str]] = {
    "reward_by_step": (
        "SELECT step, rollouts, mean_reward, held_out_mean_reward FROM reward_by_step "
        "WHERE run_id = {run:String} ORDER BY step",
        "SELECT s.policy_version AS step, count(), avgIf(s.reward, s.status = 'ok'), "
        "avgIf(s.reward, s.status = 'ok' AND JSONExtractString(r.info, 'split') = 'test') "
        "FROM scored AS s FINAL LEFT JOIN "
        "(SELECT rollout_id, info FROM rollouts FINAL WHERE run_id = {run:String}) AS r "
        "ON s.rollout_id = r.rollout_id WHERE s.run_id = {run:String} GROUP BY step ORDER BY step",
    ),
    "staleness": (
        "SELECT step, samples, mean_versions_behind, dropped_stale FROM staleness "
        "WHERE run_id = {run:String} ORDER BY step",
        "SELECT step, arraySum(mapValues(staleness)), "
        "arraySum(arrayMap((k, v) -> toInt64(k) * v, mapKeys(staleness), mapValues(staleness)))"
        " / arraySum(mapValues(staleness)), dropped_stale "
        "FROM train_steps FINAL WHERE run_id = {run:String} ORDER BY step",
    ),
    "throughput": (
        "SELECT role, policy_version, tokens FROM throughput WHERE run_id = {run:String} "
        "ORDER BY role, policy_version",
        "SELECT * FROM (SELECT 'inference', policy_version, toInt64(sum(length(completion_ids))) "
        "FROM tokens FINAL WHERE run_id = {run:String} GROUP BY policy_version UNION ALL "
        "SELECT 'trainer', step, num_tokens FROM train_steps FINAL WHERE run_id = {run:String}) "
        "ORDER BY 1, 2",
    ),
    "pass_at_k": (
        "SELECT k, pass_at_k FROM pass_at_k WHERE run_id = {run:String} ORDER BY k",
        "SELECT count(), countIf(status = 'ok' AND reward >= 1) FROM scored FINAL "
        "WHERE run_id = {run:String} GROUP BY env, task_id",
    ),
    "errors_by_kind": (
        "SELECT stage, kind, errors FROM errors_by_kind WHERE run_id = {run:String} "
        "ORDER BY stage, kind",
        "SELECT * FROM (SELECT 'rollout' AS stage, "
        "if(error_kind = '', 'unknown', toString(error_kind)) AS kind, count() AS n "
        "FROM rollouts FINAL WHERE run_id = {run:String} AND status != 'ok' "
        "GROUP BY error_kind "
        "UNION ALL SELECT 'scoring', 'reward', count() FROM scored FINAL "
        "WHERE run_id = {run:String} AND status != 'ok' AND rollout_id NOT IN "
        "(SELECT rollout_id FROM rollouts WHERE run_id = {run:String} AND status != 'ok') "
        "UNION ALL SELECT 'dead_letter:tasks', consumer_group, count() FROM dead_letters FINAL "
        "WHERE run_id = {run:String} GROUP BY consumer_group) WHERE n > 0 ORDER BY 1, 2",
    ),
    "latency": (
        "SELECT env, rollouts, rollout_p90_s, call_p90_s FROM latency WHERE run_id = {run:String}",
        "SELECT a.env, a.n, a.p90, b.c90 FROM (SELECT env, count() AS n, "
        "quantileExactInclusive(0.9)(duration_s) AS p90 FROM rollouts FINAL "
        "WHERE run_id = {run:String} GROUP BY env) AS a LEFT JOIN "
        "(SELECT r.env AS env, quantileExactInclusive(0.9)(t.duration_s) AS c90 "
        "FROM tokens AS t FINAL INNER JOIN (SELECT rollout_id, env FROM rollouts FINAL "
        "WHERE run_id = {run:String}) AS r ON t.rollout_id = r.rollout_id "
        "WHERE t.run_id = {run:String} GROUP BY env) AS b ON a.env = b.env",
    ),
}
"""view: (as the ui reads it, a plain query for the same figures)."""


def pass_at_k_plain(counts: list[tuple]) -> list[tuple[int, float]]:
    smallest = min(n for n, _ in counts)
    ks = [2**e for e in range(21) if 2**e <= smallest]
    return [
        (
            k,
            sum(1.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k) for n, c in counts)
            / len(counts),
        )
        for k in ks
    ]


def same(view: list[tuple], plain: list[tuple], name: str) -> None:
    """The view and its plain query agree (floats to 1e-9 relative)."""
    assert len(view) == len(plain), f"{name}: {len(view)} rows vs {len(plain)}"
    for a, b in zip(view, plain, strict=True):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) or isinstance(y, float):
                assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) or (
                    math.isnan(x) and math.isnan(y)
                ), f"{name}: {a} vs {b}"
            else:
                assert str(x) == str(y), f"{name}: {a} vs {b}"


def time_views(store: Store, repeat: int) -> list[tuple[str, float, float]]:
    out = []
    for name, (view_sql, plain_sql) in VIEWS.items():
        view_s, plain_s, view_rows, plain_rows = paired(
            lambda q=view_sql: store.query(q, RUN).rows,
            lambda q=plain_sql: store.query(q, RUN).rows,
            repeat,
        )
        if name == "pass_at_k":  # the plain query's per-task counts, through the formula
            plain_rows = pass_at_k_plain(plain_rows)
        same(view_rows, plain_rows, name)
        out.append((name, view_s, plain_s))
    return out


@dataclass
class Page:
    name: str
    path: str
    plain: list[tuple[str, dict[str, Any]]]
    """Plain SQL for the data the page shows, run in this process as its baseline."""


def pages(store: Store) -> list[Page]:
    ids = [
        r[0]
        for r in store.query(
            "SELECT rollout_id FROM rollouts WHERE run_id = 'train-a' ORDER BY rollout_id"
        ).rows
    ]
    middle = ids[len(ids) // 2]
    multi = store.query(
        "SELECT rollout_id FROM rollouts WHERE run_id = 'train-a' AND num_turns > 2 LIMIT 1"
    ).rows[0][0]
    task = store.query(
        "SELECT task_id FROM rollouts WHERE run_id = 'train-a' ORDER BY rollout_id LIMIT 1"
    ).rows[0][0]
    table = (
        "SELECT rollout_id, run_id, env, task_id, sample_index, status, error_kind, model, "
        "num_turns, completion_tokens, min_policy_version, max_policy_version, duration_s, ts "
        "FROM rollouts WHERE run_id = 'train-a' {extra} ORDER BY rollout_id LIMIT 51"
    )
    scores = (
        "SELECT rollout_id, argMax(reward, ts), argMax(status, ts), count() FROM scored "
        "WHERE rollout_id IN {ids:Array(String)} GROUP BY rollout_id",
        {"ids": ids[:50]},
    )
    run_list = ("SELECT DISTINCT run_id FROM rollouts", {})
    console_sql = (
        "SELECT policy_version, avg(reward) FROM scored WHERE run_id = 'train-a' "
        "GROUP BY policy_version ORDER BY policy_version"
    )
    runs = [
        (
            "SELECT run_id, groupUniqArray(env), groupUniqArray(model), count(), "
            "countIf(status != 'ok'), min(ts), max(ts) FROM rollouts FINAL GROUP BY run_id",
            {},
        ),
        ("SELECT run_id, max(step), max(ts) FROM train_steps GROUP BY run_id", {}),
        (
            "SELECT run_id, argMax(r, v), max(v) FROM (SELECT run_id, policy_version AS v, "
            "avgIf(reward, status = 'ok') AS r FROM scored FINAL GROUP BY run_id, v) "
            "GROUP BY run_id",
            {},
        ),
    ]
    run = [
        (
            "SELECT groupUniqArray(env), groupUniqArray(model), groupUniqArray(harness), "
            "count(), countIf(status != 'ok'), min(ts), max(ts) FROM rollouts FINAL "
            "WHERE run_id = {run:String}",
            RUN,
        ),
        ("SELECT max(step), count() FROM train_steps WHERE run_id = {run:String}", RUN),
        *((plain, RUN) for _, plain in VIEWS.values()),
        (
            "SELECT step, loss, grad_norm, entropy, mismatch_kl, lr, num_samples, num_tokens "
            "FROM train_steps FINAL WHERE run_id = {run:String} ORDER BY step",
            RUN,
        ),
        (
            "SELECT step, dropped_stale, metrics FROM batches FINAL WHERE run_id = {run:String} "
            "ORDER BY step",
            RUN,
        ),
        (
            "SELECT env, uniqExact(task_id), count(), countIf(status != 'ok'), "
            "avgIf(reward, status = 'ok'), avgIf(reward >= 1, status = 'ok') FROM scored FINAL "
            "WHERE run_id = {run:String} GROUP BY env",
            RUN,
        ),
        run_list,
    ]
    one = {"id": multi}
    rollout = [
        (f"SELECT * FROM {t} FINAL WHERE rollout_id = {{id:String}}", one)
        for t in ("rollouts", "trace_nodes", "tokens", "scored")
    ]
    sides = [
        (
            "SELECT r.rollout_id, r.completion, s.reward FROM "
            "(SELECT * FROM rollouts FINAL WHERE run_id = {run:String} AND task_id = {t:String}) "
            "AS r LEFT JOIN (SELECT rollout_id, argMax(reward, ts) AS reward FROM scored "
            "WHERE run_id = {run:String} AND task_id = {t:String} GROUP BY rollout_id) AS s "
            "ON r.rollout_id = s.rollout_id",
            {"run": side, "t": task},
        )
        for side in ("train-a", "train-b")
    ]
    compare = [
        run_list,
        (VIEWS["reward_by_step"][1], {"run": "train-a"}),
        (VIEWS["reward_by_step"][1], {"run": "train-b"}),
        (
            "SELECT task_id FROM (SELECT DISTINCT task_id FROM rollouts WHERE run_id = 'train-a' "
            "INTERSECT SELECT DISTINCT task_id FROM rollouts WHERE run_id = 'train-b') "
            "ORDER BY task_id LIMIT 200",
            {},
        ),
        *sides,
    ]
    return [
        Page("runs", "/", runs),
        Page("run", "/runs/train-a", run),
        Page(
            "rollouts: first page", "/rollouts?run=train-a", [(table.format(extra=""), {}), scores]
        ),
        Page(
            "rollouts: a cursor halfway",
            f"/rollouts?run=train-a&after={middle}",
            [(table.format(extra="AND rollout_id > {a:String}"), {"a": middle}), scores],
        ),
        Page(
            "rollouts: reward 1 at version 200",
            "/rollouts?run=train-a&min_reward=1&version=200",
            [
                (
                    table.format(
                        extra="AND 200 BETWEEN min_policy_version AND max_policy_version AND "
                        "rollout_id IN (SELECT rollout_id FROM scored WHERE reward >= 1 "
                        "AND run_id = 'train-a')"
                    ),
                    {},
                ),
                scores,
            ],
        ),
        Page(
            "rollouts: text search",
            f"/rollouts?run=train-a&text={RARE_WORD}",
            [
                (
                    table.format(
                        extra="AND (rollout_id = {w:String} OR task_id = {w:String} "
                        "OR positionCaseInsensitiveUTF8(completion, {w:String}) > 0 "
                        "OR positionCaseInsensitiveUTF8(prompt, {w:String}) > 0)"
                    ),
                    {"w": RARE_WORD},
                ),
                scores,
            ],
        ),
        Page("rollout", f"/rollouts/{multi}", rollout),
        Page("compare", f"/compare?a=train-a&b=train-b&task={task}", compare),
        Page("sql console", f"/sql?{httpx.QueryParams({'q': console_sql})}", [(console_sql, {})]),
    ]


def start_ui(url: str, log: Path) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "rlbus", "ui", "--port", "0", "--store.url", url],
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not found:
        process.kill()
        raise RuntimeError(f"rlbus ui did not start: {line!r} {log.read_text()[-2000:]}")
    return process, found.group(0)


def time_pages(
    store: Store, base: str, repeat: int
) -> list[tuple[str, float, float, float | None]]:
    out = []
    with httpx.Client(base_url=base, timeout=600) as http:
        for page in pages(store):

            def get(p: Page = page) -> None:
                response = http.get(p.path)
                assert response.status_code == 200, (p.path, response.text[-500:])

            def plain(p: Page = page) -> None:
                for sql, params in p.plain:
                    store.query(sql, params)

            ui_s, sql_s, _, _ = paired(get, plain, repeat)
            out.append((page, ui_s, sql_s))
    loads = browser_loads(base, [p for p, *_ in out], max(3, repeat // 3))
    return [(p.name, ui_s, sql_s, loads.get(p.name)) for p, ui_s, sql_s in out]


def browser_loads(base: str, shown: list[Page], repeat: int) -> dict[str, float]:
    """p95 seconds from request to load event in headless chromium, per page (none without
    one)."""

    def load_ms(tab: BrowserPage, path: str) -> float:
        tab.goto(base + path)
        return timing(tab)["load"]

    loads: dict[str, float] = {}
    try:
        with chromium_page() as tab:
            for page in shown:
                samples = [load_ms(tab, page.path) for _ in range(repeat + 1)]
                loads[page.name] = p95(samples[1:]) / 1000
    except BrowserMissing as exc:
        console.print(f"[yellow]browser load not measured: {exc}[/]")
    return loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=10, help="timings per figure (p95 taken)")
    parser.add_argument("--block", type=int, default=50_000, help="rows per insert, per kind")
    parser.add_argument(
        "--store", type=Path, help="keep the store here (filled once; reused when it holds enough)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        directory = args.store or Path(tmp) / "store"
        url = f"chdb://{directory.resolve()}"
        with open_store(url) as store:
            have = store.query("SELECT count() FROM rollouts").rows[0][0]
            if have < args.rollouts * 0.99:
                if have:
                    raise SystemExit(f"{directory} holds {have:,} rollouts; use a fresh --store")
                console.print(f"filling {url} with {args.rollouts:,} rollouts ...")
                seconds = fill(store, args.rollouts, args.block)
                console.print(
                    f"filled in {seconds:,.0f} s ({args.rollouts / seconds:,.0f} rollouts/s)"
                )
            console.print(f"merges settled after {settle(store):.0f} s")
            per_rollout, tables = bytes_per_rollout(store)
            sizes = Table(title=f"store: {per_rollout:,.0f} bytes per rollout")
            for col in ("table", "rows", "MiB on disk"):
                sizes.add_column(col, justify="left" if col == "table" else "right")
            for name, rows, size in tables:
                sizes.add_row(name, f"{rows:,}", f"{size / 2**20:,.1f}")
            console.print(sizes)

            views = time_views(store, args.repeat)
            store.serve()  # `rlbus ui` reads through this process, as while a run holds the store
            ui, base = start_ui(url, Path(tmp) / "ui.log")
            try:
                shown = time_pages(store, base, args.repeat)
            finally:
                ui.terminate()
                ui.wait(15)

    table = Table(title=f"views, run train-a (p95 of {args.repeat})")
    for col in ("view", "view s", "plain SQL s", "ratio"):
        table.add_column(col, justify="left" if col == "view" else "right")
    for name, view_s, plain_s in views:
        table.add_row(name, f"{view_s:.3f}", f"{plain_s:.3f}", f"{view_s / plain_s:.2f}")
    console.print(table)
    table = Table(title=f"rlbus ui pages (p95 of {args.repeat})")
    for col in ("page", "server s", "plain SQL s", "ratio", "browser load s"):
        table.add_column(col, justify="left" if col == "page" else "right")
    for name, ui_s, sql_s, load_s in shown:
        table.add_row(
            name,
            f"{ui_s:.3f}",
            f"{sql_s:.3f}",
            f"{ui_s / sql_s:.2f}",
            "–" if load_s is None else f"{load_s:.3f}",
        )
    console.print(table)
    console.print(f"store: {per_rollout:,.0f} bytes per rollout")
    ui_ratio = max(ui_s / sql_s for _, ui_s, sql_s, _ in shown)
    view_ratio = max(view_s / plain_s for _, view_s, plain_s in views)
    print(f"RESULT ui_vs_sql_p95={ui_ratio:.3f} views_vs_sql_p95={view_ratio:.3f}")


if __name__ == "__main__":
    main()
