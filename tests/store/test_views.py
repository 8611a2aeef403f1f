"""The analytics views (bus/store/views) over events that went through the real sink into chdb,
each checked against figures this test computes itself from the events it published."""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from support.isolated import module_settings
from support.sinks import publish, start_sink

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store import Store, open_store
from rlbus.bus.waiting import wait_for
from rlbus.launch.processes import alive
from rlbus.schemas import (
    DeadLetter,
    Event,
    RolloutCompleted,
    RolloutScored,
    TokenRecord,
    TrainStep,
    WeightLoaded,
    WeightVersion,
    derived_id,
)
from rlbus.schemas.packed import pack_logprobs, pack_tokens

T0 = 1.75e9
ENVS = {"alpha": [4, 4, 4, 6], "beta": [3, 5]}
"""Rollouts per task, by environment: alpha's smallest group is 4 (pass@1, 2, 4), beta's 3."""
HELD_OUT_TASK = "alpha-3"


@dataclass
class Data:
    run: str
    other: str
    events: list[Event] = field(default_factory=list)

    def of(self, kind: type, run: str | None = None) -> list:
        return [e for e in self.events if type(e) is kind and e.run_id == (run or self.run)]


def build(run: str, other: str) -> Data:
    """Two environments' rollouts with scores, model calls, errors of each kind, train steps
    and dead letters; a second run to tell apart."""
    rng = np.random.default_rng(7)
    data = Data(run, other)
    i = 0
    for env, sizes in ENVS.items():
        for t, size in enumerate(sizes):
            task = f"{env}-{t}"
            for sample in range(size):
                i += 1
                rollout, version = derived_id("rollout", run, i), i % 3
                failed = i % 7 == 0
                duration = float(rng.uniform(1, 5))
                ended = T0 + 10 * i
                data.events.append(
                    RolloutCompleted(
                        run_id=run,
                        ts=ended,
                        rollout_id=rollout,
                        group_id=derived_id("group", run, task),
                        task_id=task,
                        env=env,
                        sample_index=sample,
                        group_size=size,
                        info=(
                            # two evaluations, each sampled across versions (an async run)
                            {"split": "test", "eval_version": 10 * (sample % 2)}
                            if task == HELD_OUT_TASK
                            else {"split": "train"}
                        ),
                        status="error" if failed else "ok",
                        error="it broke" if failed else "",
                        error_kind=("timeout" if i % 2 else "") if failed else "",
                        min_policy_version=version,
                        max_policy_version=version,
                        duration_s=duration,
                    )
                )
                reward_failed = i == 9  # a good rollout whose reward function raised
                data.events.append(
                    RolloutScored(
                        run_id=run,
                        ts=ended + 1,
                        rollout_id=rollout,
                        group_id=derived_id("group", run, task),
                        task_id=task,
                        env=env,
                        sample_index=sample,
                        group_size=size,
                        reward=0.0 if failed else float(rng.choice([0.0, 0.5, 1.0])),
                        status="error" if failed or reward_failed else "ok",
                        error="reward raised" if reward_failed else "",
                        policy_version=version,
                        completion_tokens=int(rng.integers(1, 50)),
                    )
                )
                calls = 0 if i == 5 else 1 + i % 3  # rollout 5 made no model call
                for call in range(calls):
                    n = int(rng.integers(1, 20))
                    data.events.append(
                        TokenRecord(
                            run_id=run,
                            ts=ended - 0.5 * (calls - call),
                            rollout_id=rollout,
                            call_index=call,
                            completion_ids=pack_tokens(rng.integers(0, 1000, n)),
                            logprobs=pack_logprobs(-rng.random(n)),
                            policy_version=version,
                            duration_s=round(float(rng.uniform(0.05, 0.4)), 4),
                        )
                    )
    for step, hist, dropped in ((1, {"0": 16}, 0), (2, {"0": 10, "1": 6}, 1), (3, {"1": 4}, 3)):
        data.events.append(
            TrainStep(
                run_id=run,
                ts=T0 + 1000 + step,
                step=step,
                num_tokens=1000 * step,
                tokens_per_s=250.0 * step,
                staleness=hist,
                dropped_stale=dropped,
                metrics={"step_s": 10.0 * step, "weights_write_s": 0.5, "weights_mb": 270.0},
            )
        )
        published = T0 + 1000 + step
        data.events.append(
            WeightVersion(
                run_id=run, ts=published, version=step, uri=f"file:///w/v{step}.safetensors"
            )
        )
        # version 3 is not served yet; versions 1 and 2 by two workers, 2 also after a restart
        loads = {1: [("a", 1.25), ("b", 2.0)], 2: [("a", 0.75), ("b", 1.5), ("b", 3.0)]}
        for n, (worker, after) in enumerate(loads.get(step, [])):
            data.events.append(
                WeightLoaded(
                    run_id=run,
                    event_id=derived_id(run, "loaded", step, n),
                    ts=published + after,
                    version=step,
                    worker_id=worker,
                    load_s=after / 2,
                )
            )
    for n in range(3):
        data.events.append(
            DeadLetter(
                run_id=run,
                ts=T0 + n,
                origin_topic="tasks" if n < 2 else "rollouts",
                origin_partition=0,
                origin_offset=n,
                consumer_group="env" if n < 2 else "judge",
                error=f"bad message {n}",
            )
        )
    data.events += [
        RolloutScored(
            run_id=other,
            rollout_id=derived_id("rollout", other, 1),
            group_id="g",
            task_id="alpha-0",
            env="alpha",
            reward=1.0,
        ),
        TrainStep(run_id=other, step=1, staleness={"5": 1}, dropped_stale=9),
    ]
    return data


@pytest.fixture(scope="module")
def filled(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Store, Data]]:
    """The data published twice over (an at-least-once producer's retry) into a real sink
    process; the views are read through its endpoint."""
    tmp = tmp_path_factory.mktemp("views")
    settings = module_settings(broker, tmp)
    data = build(settings.run_id, f"{settings.run_id}-other")
    sink = start_sink(settings, tmp / "logs")
    try:
        asyncio.run(publish(settings, data.events + data.events[::3]))
        expected = len({e.event_id for e in data.events})
        with open_store(settings.store.url, read_only=True) as store:
            tables = sorted({type(e).table for e in data.events})
            count = " + ".join(f"(SELECT count() FROM {t} FINAL)" for t in tables)
            wait_for(
                lambda: store.query(f"SELECT {count}").rows[0][0] >= expected,
                120,
                f"{expected} events in the store",
                check=alive(sink),
            )
            yield store, data
    finally:
        sink.stop()


def rows(store: Store, sql: str, run: str) -> list[dict]:
    result = store.query(sql, {"run": run})
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=2e-6)


def test_staleness_per_step(
    filled: tuple[Store, Data],
) -> None:
    store, data = filled
    latest = {s.step: s for s in data.of(TrainStep)}
    got = rows(store, "SELECT * FROM staleness WHERE run_id = {run:String} ORDER BY step", data.run)
    assert [r["step"] for r in got] == sorted(latest)
    for r in got:
        s = latest[r["step"]]
        hist = {int(k): v for k, v in s.staleness.items()}
        total = sum(hist.values())
        assert r["histogram"] == dict(sorted(hist.items()))
        assert r["samples"] == total and r["dropped_stale"] == s.dropped_stale
        assert close(r["mean_versions_behind"], sum(k * v for k, v in hist.items()) / total)
        assert r["max_versions_behind"] == max(hist)
    assert rows(store, "SELECT step FROM staleness WHERE run_id = {run:String}", data.other) == [
        {"step": 1}
    ]


def test_throughput_per_role_and_version(filled: tuple[Store, Data]) -> None:
    store, data = filled
    by_version: dict[int, list[TokenRecord]] = defaultdict(list)
    for record in data.of(TokenRecord):
        by_version[record.policy_version].append(record)
    expected = {}
    for version, records in by_version.items():
        tokens = sum(len(r.completion_ids) // 4 for r in records)
        # Stored at microsecond precision, the call's start truncated to a whole microsecond.
        start = min(round(r.ts * 1e6) - int(r.duration_s * 1e6) for r in records) / 1e6
        seconds = max(round(r.ts * 1e6) for r in records) / 1e6 - start
        expected[("inference", version)] = (len(records), tokens, seconds, tokens / seconds)
    for s in data.of(TrainStep):
        expected[("trainer", s.step)] = (
            1,
            s.num_tokens,
            s.num_tokens / s.tokens_per_s,
            s.tokens_per_s,
        )
    got = rows(store, "SELECT * FROM throughput WHERE run_id = {run:String}", data.run)
    assert {(r["role"], r["policy_version"]) for r in got} == set(expected)
    for r in got:
        events, tokens, seconds, rate = expected[(r["role"], r["policy_version"])]
        assert (r["events"], r["tokens"]) == (events, tokens)
        assert close(r["seconds"], seconds) and math.isclose(r["tokens_per_s"], rate, rel_tol=1e-6)


def test_weight_updates_time_each_version_from_publication_to_its_last_worker(
    filled: tuple[Store, Data],
) -> None:
    store, data = filled
    got = rows(
        store, "SELECT * FROM weight_updates WHERE run_id = {run:String} ORDER BY version", data.run
    )
    assert [r["version"] for r in got] == [1, 2, 3]
    one, two, three = got
    assert (one["workers"], one["first_served_s"], one["last_served_s"]) == (2, 1.25, 2.0)
    assert (two["workers"], two["first_served_s"], two["last_served_s"]) == (2, 0.75, 3.0)
    assert close(two["load_s"], 1.5) and close(two["write_s"], 0.5)
    assert close(two["share"], (0.5 + 3.0) / 20.0) and close(two["weights_mb"], 270.0)
    assert three["workers"] == 0 and three["last_served_s"] is None and three["share"] is None
    assert rows(store, "SELECT * FROM weight_updates WHERE run_id = {run:String}", data.other) == []


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021), written out as the ratio of binomials."""
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_pass_at_k_is_the_unbiased_estimator_up_to_the_smallest_group(
    filled: tuple[Store, Data],
) -> None:
    store, data = filled
    tasks: dict[str, dict[str, list[RolloutScored]]] = defaultdict(lambda: defaultdict(list))
    for s in data.of(RolloutScored):
        tasks[s.env][s.task_id].append(s)
    expected = {}
    for env, by_task in tasks.items():
        counts = [
            (len(group), sum(s.status == "ok" and s.reward >= 1 for s in group))
            for group in by_task.values()
        ]
        smallest = min(n for n, _ in counts)
        for k in (1, 2, 4, 8):
            if k <= smallest:
                expected[(env, k)] = sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
    assert {(e, k) for e, k in expected} == {("alpha", 1), ("alpha", 2), ("alpha", 4)} | {
        ("beta", 1),
        ("beta", 2),
    }
    got = rows(store, "SELECT * FROM pass_at_k WHERE run_id = {run:String}", data.run)
    assert {(r["env"], r["k"]): r["pass_at_k"] for r in got}.keys() == expected.keys()
    for r in got:
        assert close(r["pass_at_k"], expected[(r["env"], r["k"])]), r
        assert r["tasks"] == len(tasks[r["env"]])
    # pass@1 is the plain pass rate over a task's samples, averaged over tasks.
    alpha_1 = next(r["pass_at_k"] for r in got if (r["env"], r["k"]) == ("alpha", 1))
    per_task = [
        np.mean([s.status == "ok" and s.reward >= 1 for s in g]) for g in tasks["alpha"].values()
    ]
    assert close(alpha_1, float(np.mean(per_task)))


def test_errors_by_kind_counts_rollout_reward_and_dead_letter_errors(
    filled: tuple[Store, Data],
) -> None:
    store, data = filled
    expected: dict[tuple[str, str, str], int] = defaultdict(int)
    failed = {r.rollout_id for r in data.of(RolloutCompleted) if r.status != "ok"}
    for r in data.of(RolloutCompleted):
        if r.status != "ok":
            expected[(r.env, "rollout", r.error_kind or "unknown")] += 1
    for s in data.of(RolloutScored):
        if s.status != "ok" and s.rollout_id not in failed:
            expected[(s.env, "scoring", "reward")] += 1
    for d in data.of(DeadLetter):
        expected[("", f"dead_letter:{d.origin_topic}", d.consumer_group)] += 1
    got = rows(store, "SELECT * FROM errors_by_kind WHERE run_id = {run:String}", data.run)
    assert {(r["env"], r["stage"], r["kind"]): r["errors"] for r in got} == expected
    assert {k for _, _, k in expected} == {"timeout", "unknown", "reward", "env", "judge"}
    reward = next(r for r in got if r["kind"] == "reward")
    assert reward["last_error"] == "reward raised"


def test_latency_percentiles_of_rollouts_model_calls_and_harness(
    filled: tuple[Store, Data],
) -> None:
    store, data = filled
    got = {
        r["env"]: r
        for r in rows(store, "SELECT * FROM latency WHERE run_id = {run:String}", data.run)
    }
    assert set(got) == set(ENVS)
    calls: dict[str, list[float]] = defaultdict(list)
    for record in data.of(TokenRecord):
        calls[record.rollout_id].append(record.duration_s)
    for env, r in got.items():
        rollouts = [x for x in data.of(RolloutCompleted) if x.env == env]
        durations = np.array([x.duration_s for x in rollouts])
        call_s = np.array([c for x in rollouts for c in calls[x.rollout_id]])
        harness = np.array([max(x.duration_s - sum(calls[x.rollout_id]), 0) for x in rollouts])
        assert r["rollouts"] == len(rollouts) and r["model_calls"] == len(call_s)
        for q in (50, 90, 99):
            assert close(r[f"rollout_p{q}_s"], float(np.percentile(durations, q)))
            assert close(r[f"call_p{q}_s"], float(np.percentile(call_s, q)))
        for q in (50, 90):
            assert close(r[f"harness_p{q}_s"], float(np.percentile(harness, q)))
        assert close(r["rollout_max_s"], float(durations.max()))
        assert close(r["call_max_s"], float(call_s.max()))
        assert close(r["model_share"], float(call_s.sum() / durations.sum()))


def test_reward_by_step_keeps_its_columns_and_splits_train_from_held_out(
    filled: tuple[Store, Data],
) -> None:
    store, data = filled
    split = {r.rollout_id: r.info["split"] for r in data.of(RolloutCompleted)}
    by_version: dict[int, list[RolloutScored]] = defaultdict(list)
    for s in data.of(RolloutScored):
        by_version[s.policy_version].append(s)
    got = rows(
        store, "SELECT * FROM reward_by_step WHERE run_id = {run:String} ORDER BY step", data.run
    )
    assert [r["step"] for r in got] == sorted(by_version)
    for r in got:
        scores = by_version[r["step"]]
        ok = [s for s in scores if s.status == "ok"]
        train = [s for s in ok if split[s.rollout_id] == "train"]
        held = [s for s in ok if split[s.rollout_id] == "test"]
        assert r["rollouts"] == len(scores) and r["errors"] == len(scores) - len(ok)
        assert close(r["mean_reward"], float(np.mean([s.reward for s in ok])))
        assert close(r["pass_rate"], float(np.mean([s.reward >= 1 for s in ok])))
        assert close(r["mean_completion_tokens"], float(np.mean([s.completion_tokens for s in ok])))
        assert close(r["reward_stddev"], float(np.std([s.reward for s in ok])))
        assert r["train_rollouts"] == sum(split[s.rollout_id] == "train" for s in scores)
        assert r["held_out_rollouts"] == sum(split[s.rollout_id] == "test" for s in scores)
        assert close(r["train_mean_reward"], float(np.mean([s.reward for s in train])))
        assert close(r["held_out_mean_reward"], float(np.mean([s.reward for s in held])))
        assert close(r["held_out_pass_rate"], float(np.mean([s.reward >= 1 for s in held])))


def documented_view_queries() -> list[str]:
    page = (Path(__file__).resolve().parents[2] / "docs" / "views.md").read_text()
    return [block.split("```", 1)[0] for block in page.split("```sql\n")[1:]]


def test_every_query_the_views_page_shows_runs_and_finds_the_runs_rows(
    filled: tuple[Store, Data],
) -> None:
    store, data = filled
    queries = documented_view_queries()
    assert len(queries) >= 7
    for sql in queries:
        assert rows(store, sql, data.run), f"no rows for docs/views.md's query:\n{sql}"


def test_held_out_by_env_is_each_environments_reward_per_evaluation(
    filled: tuple[Store, Data],
) -> None:
    """A run of several environments (an experts recipe's student, a joint run) compared per
    environment: held-out rollouts only, one row per evaluation (the version it was made for,
    `eval_version`), whichever versions sampled its tasks. Grouped by the sampling version, an
    async run's evaluation of 64 tasks read as three points of 17, 35 and 12 tasks
    (bench/experts.py's plot)."""
    store, data = filled
    info = {r.rollout_id: r.info for r in data.of(RolloutCompleted)}
    held: dict[tuple[str, int], list[RolloutScored]] = defaultdict(list)
    for s in data.of(RolloutScored):
        if info[s.rollout_id]["split"] == "test":
            held[(s.env, info[s.rollout_id]["eval_version"])].append(s)
    got = rows(
        store,
        "SELECT * FROM held_out_by_env WHERE run_id = {run:String} ORDER BY env, step",
        data.run,
    )
    assert [(r["env"], r["step"]) for r in got] == sorted(held)
    for r in got:
        scores = held[(r["env"], r["step"])]
        ok = [s for s in scores if s.status == "ok"]
        assert r["rollouts"] == len(scores) and r["errors"] == len(scores) - len(ok)
        assert r["tasks"] == len({s.task_id for s in scores})
        versions = [s.policy_version for s in scores]
        assert (r["min_policy_version"], r["max_policy_version"]) == (min(versions), max(versions))
        assert min(versions) < max(versions)  # the fixture's evaluations span versions
        assert close(r["mean_reward"], float(np.mean([s.reward for s in ok])))
        assert close(r["pass_rate"], float(np.mean([s.reward >= 1 for s in ok])))
