"""Every query the ui runs. The SQL text is fixed (a filter adds a fixed condition); whatever a
user typed travels only as a {name:Type} parameter value, never as SQL. The console is the one
place that runs a user's SQL, through the store's read-only path with row and time limits."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any

from rlbus.bus.store import Rows
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


RUNS_ROLLOUTS = """
SELECT run_id, groupUniqArrayIf(8)(env, env != '') AS envs,
       groupUniqArrayIf(4)(model, model != '') AS models,
       count() AS rollouts, countIf(status != 'ok') AS errors,
       min(ts) AS first_ts, max(ts) AS last_ts
FROM rollouts FINAL GROUP BY run_id
"""
RUNS_STEPS = (
    "SELECT run_id, max(step) AS steps, max(ts) AS last_step_ts FROM train_steps GROUP BY run_id"
)
RUNS_REWARD = """
SELECT run_id, argMax(mean_reward, step) AS latest_reward, max(step) AS latest_version
FROM (
    SELECT run_id, policy_version AS step, avgIf(reward, status = 'ok') AS mean_reward
    FROM latest_scores FINAL GROUP BY run_id, step
)
GROUP BY run_id
"""
"""reward_by_step's mean_reward at each run's newest version (each rollout's newest score),
without the view's join (the runs page reads every run)."""

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

RUN_CONDITION = "run_id = {run:String}"
RUN_WHERE = f"WHERE {RUN_CONDITION}"
RUN_SUMMARY = f"""
SELECT groupUniqArrayIf(env, env != '') AS envs, groupUniqArrayIf(model, model != '') AS models,
       groupUniqArrayIf(harness, harness != '') AS harnesses, count() AS rollouts,
       countIf(status != 'ok') AS errors, min(ts) AS first_ts, max(ts) AS last_ts,
       (SELECT max(step) FROM train_steps {RUN_WHERE}) AS steps,
       (SELECT count() FROM train_steps {RUN_WHERE}) AS steps_stored
FROM rollouts FINAL {RUN_WHERE}
"""
RUN_IDS = "SELECT run_id, max(ts) AS last FROM rollouts GROUP BY run_id ORDER BY last DESC"
REWARD_CURVE = f"SELECT * FROM reward_by_step {RUN_WHERE} ORDER BY step"
CHOICES = """
SELECT
    (SELECT groupUniqArray(toString(env)) FROM rollouts WHERE 1 {scope}) AS envs,
    (SELECT groupUniqArray(if(error_kind = '', 'unknown', toString(error_kind))) FROM rollouts
     WHERE status != 'ok' {scope}) AS kinds
"""
"""The filters' choices in one round trip (`scope` is empty or a fixed run condition)."""
SCORER_VERSIONS = """
SELECT scorer_version, uniqExact(rollout_id) AS rollouts, max(ts) AS last_ts FROM scored
WHERE run_id = {run:String} GROUP BY scorer_version ORDER BY last_ts DESC, scorer_version
"""
"""A run's scorer versions, the one that scored last first."""
AT_VERSION = "version = {version:String}"
"""The score views' choice ('' = each rollout's newest score): `NAME_at(version = ...)`."""
RUN_CURVES = {
    "reward": f"SELECT * FROM reward_by_step_at({AT_VERSION}) {RUN_WHERE} ORDER BY step",
    "steps": (
        "SELECT step, loss, grad_norm, entropy, mismatch_kl, lr, num_samples, num_tokens "
        f"FROM train_steps FINAL {RUN_WHERE} ORDER BY step, ts DESC LIMIT 1 BY step"
    ),
    "staleness": f"SELECT * FROM staleness {RUN_WHERE} ORDER BY step",
    "throughput": f"SELECT * FROM throughput {RUN_WHERE} ORDER BY role, policy_version",
    "weights": f"SELECT * FROM weight_updates {RUN_WHERE} ORDER BY version",
    "drops": (
        "SELECT step, dropped_stale, metrics['dropped_zero_signal'] AS dropped_zero_signal, "
        "metrics['dropped_too_long'] AS dropped_too_long, "
        "metrics['errored_rollouts'] AS errored_rollouts "
        f"FROM batches FINAL {RUN_WHERE} ORDER BY step, ts DESC LIMIT 1 BY step"
    ),
    "pass_at_k": (
        f"SELECT env, k, pass_at_k, tasks, rollouts FROM pass_at_k_at({AT_VERSION}) {RUN_WHERE} "
        "ORDER BY env, k"
    ),
    "errors": (
        "SELECT env, stage, kind, errors, last_ts, last_error "
        f"FROM errors_by_kind_at({AT_VERSION}) {RUN_WHERE} ORDER BY errors DESC"
    ),
    "latency": f"SELECT * EXCEPT run_id FROM latency {RUN_WHERE} ORDER BY env",
    "envs": f"SELECT * EXCEPT run_id FROM env_pass_rate_at({AT_VERSION}) {RUN_WHERE} ORDER BY env",
    "versions": SCORER_VERSIONS,
}
"""What a run's page shows, each keyed by run; the scores as of the chosen scorer version."""


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
            conditions.append("run_id = {run:String}")
            params["run"] = self.run
        if self.env:
            conditions.append("env = {env:String}")
            params["env"] = self.env
        if self.version is not None:
            conditions.append("{version:Int64} BETWEEN min_policy_version AND max_policy_version")
            params["version"] = self.version
        if self.error_kind == "reward":
            conditions.append(
                "status = 'ok' AND rollout_id IN "
                "(SELECT rollout_id FROM scored WHERE status != 'ok')"
            )
        elif self.error_kind:
            conditions.append("status != 'ok' AND error_kind = {error_kind:String}")
            params["error_kind"] = "" if self.error_kind == "unknown" else self.error_kind
        if self.text:
            conditions.append(
                "(rollout_id = {text:String} OR task_id = {text:String} "
                "OR positionCaseInsensitiveUTF8(completion, {text:String}) > 0 "
                "OR positionCaseInsensitiveUTF8(prompt, {text:String}) > 0)"
            )
            params["text"] = self.text
        if self.min_reward is not None or self.max_reward is not None:
            bounds = []
            if self.min_reward is not None:
                bounds.append("reward >= {min_reward:Float64}")
                params["min_reward"] = self.min_reward
            if self.max_reward is not None:
                bounds.append("reward <= {max_reward:Float64}")
                params["max_reward"] = self.max_reward
            scope = " AND run_id = {run:String}" if self.run else ""
            conditions.append(
                f"rollout_id IN (SELECT rollout_id FROM scored WHERE {' AND '.join(bounds)}{scope})"
            )
        return conditions, params


@dataclass
class RolloutPage:
    rows: list[dict[str, Any]]
    first: str | None
    """The first row's rollout_id, when rows come before it (the previous page's cursor)."""
    last: str | None
    """The last row's rollout_id, when rows come after it (the next page's cursor)."""
    seconds: float


LATEST_SCORES = """
SELECT rollout_id, argMax(reward, ts) AS reward, argMax(status, ts) AS score_status,
       count() AS scores
FROM scored WHERE rollout_id IN {ids:Array(String)} GROUP BY rollout_id
"""
"""A page's rewards: each rollout's latest score, and how many it has (scorer versions)."""
UNSCORED = {"reward": None, "score_status": None, "scores": 0}
SHARED_TASKS = """
SELECT task_id FROM (
    SELECT DISTINCT task_id FROM rollouts WHERE run_id = {a:String}
    INTERSECT
    SELECT DISTINCT task_id FROM rollouts WHERE run_id = {b:String}
)
ORDER BY task_id LIMIT 200
"""
TASK_ROLLOUTS = """
SELECT r.rollout_id AS rollout_id, r.sample_index AS sample_index, r.status AS status,
       r.error AS error, r.prompt AS prompt, r.completion AS completion,
       r.min_policy_version AS version, s.reward AS reward
FROM (
    SELECT * FROM rollouts FINAL WHERE run_id = {run:String} AND task_id = {task:String}
) AS r
LEFT JOIN (
    SELECT rollout_id, argMax(reward, ts) AS reward FROM scored
    WHERE run_id = {run:String} AND task_id = {task:String} GROUP BY rollout_id
) AS s ON r.rollout_id = s.rollout_id
ORDER BY version, sample_index
"""
ROLLOUT = """
SELECT * EXCEPT (kafka_partition, kafka_offset) FROM rollouts FINAL
WHERE rollout_id = {id:String} ORDER BY ts DESC LIMIT 1
"""
SCORES = """
SELECT * EXCEPT (kafka_partition, kafka_offset, rollout_id, group_id, task_id, env, sample_index,
                 group_size, schema_version, run_id)
FROM scored FINAL WHERE rollout_id = {id:String} ORDER BY ts
"""
ROLLOUT_COLUMNS = (
    "rollout_id, run_id, env, task_id, sample_index, status, error_kind, model, num_turns, "
    "completion_tokens, min_policy_version, max_policy_version, duration_s, ts"
)


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
            {sql: (lambda q=sql: self.rows(q)) for sql in (RUNS_ROLLOUTS, RUNS_STEPS, RUNS_REWARD)}
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
            name: (lambda q=sql: self.rows(q, run=run_id, version=version))
            for name, sql in RUN_CURVES.items()
        }
        calls["summary"] = lambda: self.run(run_id)
        calls["run_ids"] = self.run_ids  # the page's run menu (cached) goes with the rest
        data = self.parallel(calls)
        return data.pop("summary"), data

    def run_ids(self) -> list[str]:
        return self.cached("runs", lambda: [r["run_id"] for r in self.rows(RUN_IDS)])

    # -- rollouts --------------------------------------------------------------------

    def filter_choices(self, run: str) -> dict[str, list[str]]:
        def load() -> dict[str, list[str]]:
            scope, params = (f"AND {RUN_CONDITION}", {"run": run}) if run else ("", {})
            found = self.rows(CHOICES.format(scope=scope), **params)[0]
            kinds = sorted({*found["kinds"], "reward"})
            return {"env": sorted(found["envs"]), "error_kind": kinds}

        return self.cached(("choices", run), load)

    def rollouts(self, filters: RolloutFilters, after: str = "", before: str = "") -> RolloutPage:
        """One page in rollout_id order (the table's ORDER BY key): a cursor, never OFFSET, so
        the millionth row costs what the first does."""
        conditions, params = filters.where()
        backwards = bool(before) and not after
        if after:
            conditions.append("rollout_id > {after:String}")
            params["after"] = after
        elif backwards:
            conditions.append("rollout_id < {before:String}")
            params["before"] = before
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        started = time.perf_counter()
        # Read in key order and stop early; copies of a redelivered rollout that merges have not
        # collapsed yet sit side by side, so twice the page leaves room to drop them here.
        found = self.rows(
            f"SELECT {ROLLOUT_COLUMNS} FROM rollouts {where} "
            f"ORDER BY rollout_id {'DESC' if backwards else ''} LIMIT {2 * PAGE_ROWS + 1}",
            **params,
        )
        rows = list({r["rollout_id"]: r for r in found}.values())
        more = len(rows) > PAGE_ROWS
        rows = rows[:PAGE_ROWS]
        if backwards:
            rows.reverse()
        ids = [r["rollout_id"] for r in rows]
        scores = {r["rollout_id"]: r for r in self.rows(LATEST_SCORES, ids=ids)} if ids else {}
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
        where, params = "rollout_id = {id:String}", {"id": rollout_id}
        return self.parallel(
            {
                "row": lambda: next(iter(self.rows(ROLLOUT, id=rollout_id)), None),
                "scores": lambda: self.source.query(SCORES, params),
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
                side: (lambda r=run: self.rows(TASK_ROLLOUTS, run=r, task=task))
                for side, run in runs.items()
            }

        data = self.parallel(
            {
                "runs": self.run_ids,
                "a": lambda: self.rows(REWARD_CURVE, run=a),
                "b": lambda: self.rows(REWARD_CURVE, run=b),
                "tasks": lambda: [r["task_id"] for r in self.rows(SHARED_TASKS, a=a, b=b)],
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
