"""Every query the ui runs (its SQL is rlbus.bus.store.reads.ui's and .run_page's). The SQL text
is fixed (a filter adds a fixed condition); whatever a user typed travels only as a {name:Type}
parameter value, never as SQL. The console is the one place that runs a user's SQL, through the
store's read-only path with row and time limits."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any

from rlbus.bus.store import Rows
from rlbus.bus.store.reads import ui as reads
from rlbus.bus.store.reads.run_page import REWARD_CURVE, RUN_CURVES, RUN_SUMMARY
from rlbus.schemas import TokenRecord, TraceNode
from rlbus.ui.source import StoreSource

PAGE_ROWS = 50
CONSOLE_ROWS = 1000
CONSOLE_SECONDS = 30
LIVE_S = 120
"""A run whose latest event is younger than this is shown as live."""
CHOICES_S = 10.0
"""How long the filters' choices (runs, environments, error kinds) are reused."""
PARALLEL = 4
"""Queries of one page sent at once: each waits mostly on the store's round trip."""


def records(result: Rows) -> list[dict[str, Any]]:
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def _finite(value: Any) -> Any:
    """NaN (an average over no rows) reads as missing."""
    return None if isinstance(value, float) and math.isnan(value) else value


def clean(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: _finite(v) for k, v in row.items()} for row in rows]


RUN_DEFAULTS: dict[str, Any] = {
    "envs": [],
    "models": [],
    "rollouts": 0,
    "errors": 0,
    "last_ts": None,
    "steps": None,
    "last_step_ts": None,
    "latest_reward": None,
    "latest_version": None,
}
"""A run seen in some of the tables only (a replay has steps and no rollouts)."""


@dataclass(frozen=True)
class RolloutFilters:
    """The rollouts table's filters, each optional; parsed from the page's query string."""

    run: str = ""
    env: str = ""
    version: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    error_kind: str = ""
    text: str = ""

    @classmethod
    def parse(cls, params: dict[str, str]) -> tuple[RolloutFilters, list[str]]:
        """The filters, and a message for each value that could not be read (then ignored)."""
        values: dict[str, Any] = {}
        problems = []
        for f in fields(cls):
            raw = params.get(f.name, "").strip()
            if not raw:
                continue
            if f.type == "str":
                values[f.name] = raw
                continue
            number = int if f.name == "version" else float
            try:
                values[f.name] = number(raw)
            except ValueError:
                problems.append(
                    f"{f.name}: {raw!r} is not a{'n integer' if number is int else ' number'}"
                )
        return cls(**values), problems

    def query_string(self) -> dict[str, str]:
        return {
            f.name: str(v) for f in fields(self) if (v := getattr(self, f.name)) not in ("", None)
        }

    def where(self) -> tuple[list[str], dict[str, Any]]:
        conditions, params = [], {}
        if self.run:
            conditions.append(reads.BY_RUN)
            params["run"] = self.run
        if self.env:
            conditions.append(reads.BY_ENV)
            params["env"] = self.env
        if self.version is not None:
            conditions.append(reads.BY_VERSION)
            params["version"] = self.version
        if self.error_kind == "reward":
            conditions.append(reads.SCORING_FAILED)
        elif self.error_kind:
            conditions.append(reads.BY_ERROR_KIND)
            params["error_kind"] = "" if self.error_kind == "unknown" else self.error_kind
        if self.text:
            conditions.append(reads.BY_TEXT)
            params["text"] = self.text
        if self.min_reward is not None or self.max_reward is not None:
            bounds = []
            if self.min_reward is not None:
                bounds.append(reads.MIN_REWARD)
                params["min_reward"] = self.min_reward
            if self.max_reward is not None:
                bounds.append(reads.MAX_REWARD)
                params["max_reward"] = self.max_reward
            conditions.append(reads.scored_within(bounds, bool(self.run)))
        return conditions, params


@dataclass
class RolloutPage:
    rows: list[dict[str, Any]]
    first: str | None
    """The first row's rollout_id, when rows come before it (the previous page's cursor)."""
    last: str | None
    """The last row's rollout_id, when rows come after it (the next page's cursor)."""
    seconds: float


UNSCORED = {"reward": None, "score_status": None, "scores": 0}
"""A rollout of the page that has no score yet."""


class Queries:
    def __init__(self, source: StoreSource):
        self.source = source
        self._pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="rlbus-ui-query")
        self._cache: dict[Any, tuple[float, Any]] = {}
        self._cache_lock = threading.Lock()

    def parallel(self, calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
        """Each call's result by name: the first runs on this thread (which would only wait),
        the others on the pool meanwhile."""
        (first, call), *others = calls.items()
        futures = {name: self._pool.submit(other) for name, other in others}
        done = {first: call()}
        return {name: done[name] if name == first else futures[name].result() for name in calls}

    def cached(self, key: Any, load: Callable[[], Any]) -> Any:
        """`load()`, reused for CHOICES_S seconds."""
        now = time.monotonic()
        with self._cache_lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < CHOICES_S:
            return hit[1]
        value = load()
        with self._cache_lock:
            self._cache[key] = (now, value)
        return value

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def rows(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        return clean(records(self.source.query(sql, params)))

    # -- runs ------------------------------------------------------------------------

    def runs(self) -> list[dict[str, Any]]:
        parts = self.parallel(
            {
                query: (lambda q=query: self.rows(q))
                for query in (reads.RUNS_ROLLOUTS, reads.RUNS_STEPS, reads.RUNS_REWARD)
            }
        )
        runs: dict[str, dict[str, Any]] = {}
        for rows in parts.values():
            for row in rows:
                runs.setdefault(row["run_id"], dict(RUN_DEFAULTS)).update(row)
        now = time.time()
        for run in runs.values():
            run["mode"] = "train" if run["steps"] is not None else "eval"
            latest = max(
                (t.timestamp() for t in (run["last_ts"], run["last_step_ts"]) if t), default=0.0
            )
            run["status"] = "live" if now - latest < LIVE_S else "idle"
            run["last_event"] = latest
        return sorted(runs.values(), key=lambda r: -r["last_event"])

    def run(self, run_id: str) -> dict[str, Any] | None:
        summary = {**self.rows(RUN_SUMMARY, run=run_id)[0], "run_id": run_id}
        if not summary["steps_stored"]:
            summary["steps"] = None
        if not summary["rollouts"] and summary["steps"] is None:
            return None
        summary["mode"] = "train" if summary["steps"] is not None else "eval"
        return summary

    def run_page(
        self, run_id: str, version: str = ""
    ) -> tuple[dict[str, Any] | None, dict[str, list[dict]]]:
        """A run's summary and every curve and table of its page, queried at once; scores of
        scorer `version` ('': each rollout's newest)."""
        calls: dict[str, Callable[[], Any]] = {
            name: (lambda q=query: self.rows(q, run=run_id, version=version))
            for name, query in RUN_CURVES.items()
        }
        calls["summary"] = lambda: self.run(run_id)
        calls["run_ids"] = self.run_ids  # the page's run menu (cached) goes with the rest
        data = self.parallel(calls)
        return data.pop("summary"), data

    def run_ids(self) -> list[str]:
        return self.cached("runs", lambda: [r["run_id"] for r in self.rows(reads.RUN_IDS)])

    # -- rollouts --------------------------------------------------------------------

    def filter_choices(self, run: str) -> dict[str, list[str]]:
        def load() -> dict[str, list[str]]:
            found = self.rows(reads.choices(bool(run)), **({"run": run} if run else {}))[0]
            kinds = sorted({*found["kinds"], "reward"})
            return {"env": sorted(found["envs"]), "error_kind": kinds}

        return self.cached(("choices", run), load)

    def rollouts(self, filters: RolloutFilters, after: str = "", before: str = "") -> RolloutPage:
        """One page in rollout_id order (the table's ORDER BY key): a cursor, never OFFSET, so
        the millionth row costs what the first does."""
        conditions, params = filters.where()
        backwards = bool(before) and not after
        if after:
            conditions.append(reads.AFTER)
            params["after"] = after
        elif backwards:
            conditions.append(reads.BEFORE)
            params["before"] = before
        started = time.perf_counter()
        # Read in key order and stop early; copies of a redelivered rollout that merges have not
        # collapsed yet sit side by side, so twice the page leaves room to drop them here.
        found = self.rows(reads.rollouts_page(conditions, backwards, 2 * PAGE_ROWS + 1), **params)
        rows = list({r["rollout_id"]: r for r in found}.values())
        more = len(rows) > PAGE_ROWS
        rows = rows[:PAGE_ROWS]
        if backwards:
            rows.reverse()
        ids = [r["rollout_id"] for r in rows]
        scored = self.rows(reads.LATEST_SCORES, ids=ids) if ids else []
        scores = {r["rollout_id"]: r for r in scored}
        for row in rows:
            row.update(scores.get(row["rollout_id"], UNSCORED))
        seconds = time.perf_counter() - started
        if not rows:
            return RolloutPage(rows, None, None, seconds)
        # Rows lie before this page when it was reached going forwards, or more were found going
        # backwards; after it, when more were found going forwards, or it was reached backwards.
        earlier = more if backwards else bool(after)
        later = more if not backwards else True
        return RolloutPage(
            rows,
            rows[0]["rollout_id"] if earlier else None,
            rows[-1]["rollout_id"] if later else None,
            seconds,
        )

    def rollout_page(self, rollout_id: str) -> dict[str, Any]:
        """A rollout's row, every score it got (each scorer version its own row), and its trace
        nodes and token records, queried at once."""
        where, params = reads.OF_ROLLOUT, {"id": rollout_id}
        return self.parallel(
            {
                "row": lambda: next(iter(self.rows(reads.ROLLOUT, id=rollout_id)), None),
                "scores": lambda: self.source.query(reads.SCORES, params),
                "nodes": lambda: self.source.use(
                    lambda store: store.read_events(TraceNode, where=where, parameters=params)
                ),
                "records": lambda: self.source.use(
                    lambda store: store.read_events(TokenRecord, where=where, parameters=params)
                ),
            }
        )

    # -- compare ---------------------------------------------------------------------

    def compare(self, a: str, b: str, task: str) -> dict[str, Any]:
        """Both runs' reward curves, their shared tasks, each run's rollouts of `task` (the
        first shared one when empty) and the run menu (`runs`), queried at once when `task` is
        given."""

        runs = {"side a": a, "side b": b}

        def sides(task: str) -> dict[str, Callable[[], Any]]:
            return {
                side: (lambda r=run: self.rows(reads.TASK_ROLLOUTS, run=r, task=task))
                for side, run in runs.items()
            }

        data = self.parallel(
            {
                "runs": self.run_ids,
                "a": lambda: self.rows(REWARD_CURVE, run=a, version=""),
                "b": lambda: self.rows(REWARD_CURVE, run=b, version=""),
                "tasks": lambda: [r["task_id"] for r in self.rows(reads.SHARED_TASKS, a=a, b=b)],
                **(sides(task) if task else {}),
            }
        )
        data["task"] = task or next(iter(data["tasks"]), "")
        if data["task"] and not task:
            data |= self.parallel(sides(data["task"]))
        data["sides"] = {run: data.pop(side) for side, run in runs.items() if data["task"]}
        return data

    # -- console ---------------------------------------------------------------------

    def console(self, sql: str) -> tuple[Rows, float]:
        started = time.perf_counter()
        result = self.source.query(
            sql,
            settings={
                "max_result_rows": CONSOLE_ROWS,
                "result_overflow_mode": "break",
                "max_execution_time": CONSOLE_SECONDS,
            },
        )
        return result, time.perf_counter() - started
