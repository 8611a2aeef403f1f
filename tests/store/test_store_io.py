"""Events into the chdb store and back, field for field; dedup at insert and under FINAL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from rlbus.bus.store import Store, StoreError, open_store
from rlbus.bus.store.arrow import arrow_to_events, events_to_arrow
from rlbus.bus.store.columns import columns_of
from rlbus.schemas import (
    EVENT_TYPES,
    DeadLetter,
    Event,
    HealthSample,
    RolloutCompleted,
    RolloutScored,
    RunIncident,
    TaskPublished,
    TokenRecord,
    TraceNode,
    TrainBatch,
    TrainSample,
    TrainStep,
    WeightLoaded,
    WeightVersion,
)
from rlbus.schemas.packed import pack_logprobs, pack_mask, pack_tokens

RUN = "run-7"


def one_of_each_kind() -> list[Event]:
    """A realistic event of every kind, with packed arrays, nested JSON and odd bytes."""
    messages = [
        {"role": "system", "content": "Reverse the word."},
        {"role": "user", "content": "drawer; DROP TABLE x -- 'quoted' \"too\" ünïcode"},
    ]
    completion = [
        {"role": "assistant", "content": "reward", "tool_calls": [{"id": "c1", "args": {"n": 1}}]}
    ]
    sample = TrainSample(
        rollout_id="ro-1",
        input_ids=pack_tokens([1, 17, 4, 2**32 - 1]),
        loss_mask=pack_mask([0, 0, 1, 1]),
        advantages=pack_logprobs([0.0, 0.0, 0.5, 0.5]),
        inference_logprobs=pack_logprobs([0.0, 0.0, -0.25, -1.5]),
        teacher_logprobs=pack_logprobs([0.0, 0.0, -0.2, -1.0]),
        policy_version=3,
        temperature=0.7,
    )
    return [
        TaskPublished(
            run_id=RUN,
            task_id="t-1",
            env="reverse",
            prompt=messages,
            answer="reward",
            info={"difficulty": 3, "tags": ["a", "b"], "nested": {"x": 1.5, "none": None}},
            group_size=8,
            split="eval",
        ),
        TaskPublished(run_id=RUN, task_id="t-2", env="reverse", prompt="plain string prompt"),
        RolloutCompleted(
            run_id=RUN,
            rollout_id="ro-1",
            group_id="g-1",
            task_id="t-1",
            env="reverse",
            sample_index=2,
            group_size=8,
            prompt=messages,
            completion=completion,
            answer="reward",
            info={"seed": 11},
            status="error",
            error="timeout after 30s",
            error_kind="Timeout",
            model="tiny-llama",
            harness="chat",
            num_turns=2,
            prompt_tokens=12,
            completion_tokens=4,
            min_policy_version=2,
            max_policy_version=3,
            duration_s=1.25,
        ),
        TraceNode(
            run_id=RUN,
            node_id="n-2",
            rollout_id="ro-1",
            parent_id="n-1",
            branch_id="sub-a",
            index=1,
            role="assistant",
            message=completion[0],
            token_ids=pack_tokens(range(100, 164)),
            sampled=True,
            call_index=0,
        ),
        TokenRecord(
            run_id=RUN,
            rollout_id="ro-1",
            group_id="g-1",
            call_index=1,
            node_id="n-2",
            model="tiny-llama",
            prompt_ids=pack_tokens(range(12)),
            completion_ids=pack_tokens([5, 6, 7, 0]),
            logprobs=pack_logprobs([-0.1, -2.5, -0.0, -11.0]),
            policy_version=3,
            finish_reason="stop",
        ),
        TokenRecord(run_id=RUN, rollout_id="ro-2", group_id="g-1"),
        RolloutScored(
            run_id=RUN,
            rollout_id="ro-1",
            group_id="g-1",
            task_id="t-1",
            env="reverse",
            sample_index=2,
            group_size=8,
            reward=0.6,
            rewards={"exact": 0.0, "partial": 0.6},
            metrics={"len": 4.0},
            policy_version=3,
            completion_tokens=4,
        ),
        TrainBatch(
            run_id=RUN,
            batch_id="b-1",
            step=4,
            samples=[sample, sample],
            algorithm="grpo",
            loss="dppo",
            num_tokens=8,
            min_policy_version=3,
            max_policy_version=3,
        ),
        WeightVersion(run_id=RUN, version=4, step=4, uri="file:///ckpt/step-4", num_params=912_384),
        WeightLoaded(
            run_id=RUN, version=4, worker_id="inf-0", load_s=0.31, uri="file:///ckpt/step-4"
        ),
        TrainStep(
            run_id=RUN,
            step=4,
            loss=0.125,
            grad_norm=1.5,
            entropy=2.25,
            lr=3e-4,
            mismatch_kl=0.001,
            num_samples=128,
            num_tokens=4096,
            tokens_per_s=15_000.5,
            dropped_stale=2,
            staleness={"0": 100, "1": 26},
            metrics={"clip_frac": 0.02},
        ),
        DeadLetter(
            run_id=RUN,
            origin_topic="rlbus.rollouts",
            origin_partition=3,
            origin_offset=2**40,
            consumer_group="judge",
            error="undecodable msgpack",
            raw=b"\xff\x00\x81not utf-8",
            key=b"\x00g-1",
        ),
        HealthSample(
            run_id=RUN,
            rss_mib={"sink": 412.75, "env-2": 180.5, "broker": 96.0},
            lag={"sink": 12, f"judge.{RUN}.reverse_text": 0},
        ),
        RunIncident(
            run_id=RUN,
            incident="broker-rotation",
            detail="rss 812 MB > 768 MB; 1,204 messages carried; paused 14.2 s",
        ),
    ]


def at_micros(event: Event) -> Event:
    """What the store keeps of an event: `ts` is DateTime64(6), microsecond precision."""
    return msgspec.structs.replace(event, ts=round(event.ts * 1e6) / 1e6)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"chdb://{tmp_path / 'data'}") as opened:
        yield opened


class Probe(Event, kw_only=True):
    """Field types no event uses yet, so that their mapping is tested before one does."""

    table = "probe"

    tags: list[str] = []
    counts: dict[str, int] = {}
    flag: bool = False
    blob: bytes = b""
    extra: dict[str, Any] | str = ""


def test_every_field_type_has_a_column_and_comes_back() -> None:
    mapped = [(c.name, c.ch_type) for c in columns_of(Probe)]
    assert mapped == [
        ("event_id", "String"),
        ("schema_version", "Int64"),
        ("ts", "DateTime64(6, 'UTC')"),
        ("run_id", "LowCardinality(String)"),
        ("tags", "Array(String)"),
        ("counts", "Map(String, Int64)"),
        ("flag", "Bool"),
        ("blob", "String"),
        ("extra", "String"),
    ]
    events = [
        Probe(
            tags=["a", "b"], counts={"x": 1}, flag=True, blob=b"\x00\xff", extra={"k": [1, None]}
        ),
        Probe(extra="just text"),
    ]
    table = events_to_arrow(events, [0, 0], [0, 1])
    assert arrow_to_events(Probe, table) == [at_micros(e) for e in events]


def test_every_kind_round_trips_field_for_field(store: Store) -> None:
    events = one_of_each_kind()
    assert {type(e) for e in events} == set(EVENT_TYPES)
    for kind in EVENT_TYPES:
        batch = [e for e in events if type(e) is kind]
        store.insert_events(batch, [(1, 100 + i) for i in range(len(batch))], f"{kind.table}:1:100")
        back = store.read_events(kind)
        expected = sorted(
            (at_micros(e) for e in batch), key=lambda e: [getattr(e, f) for f in kind.order_by]
        )
        assert back == expected, kind.__name__


@pytest.mark.slow
def test_positions_and_ingest_time_are_stored(store: Store) -> None:
    events = [TokenRecord(rollout_id=f"ro-{i}") for i in range(3)]
    store.insert_events(events, [(2, 10), (2, 11), (3, 7)], "tokens:2:10-11,3:7")
    rows = store.query(
        "SELECT rollout_id, kafka_partition, kafka_offset, ingested_at > now64(6) - 60 "
        "FROM tokens ORDER BY rollout_id"
    ).rows
    assert rows == [("ro-0", 2, 10, True), ("ro-1", 2, 11, True), ("ro-2", 3, 7, True)]


def test_a_block_resent_with_its_token_is_stored_once(store: Store) -> None:
    events = [
        TokenRecord(rollout_id=f"ro-{i}", completion_ids=pack_tokens([i] * 64)) for i in range(50)
    ]
    positions = [(0, i) for i in range(50)]
    store.insert_events(events, positions, "tokens:0:0-49")
    store.insert_events(events, positions, "tokens:0:0-49")
    assert store.query("SELECT count() FROM tokens").rows == [(50,)]
    store.insert_events(events, positions, "tokens:0:0-49:other")
    assert store.query("SELECT count() FROM tokens").rows == [(100,)]


@pytest.mark.slow
def test_a_duplicate_event_in_another_block_disappears_under_final(store: Store) -> None:
    first = TokenRecord(rollout_id="ro-1", completion_ids=pack_tokens([1, 2]))
    redelivered = msgspec.structs.replace(first)
    store.insert_events([first], [(0, 5)], "tokens:0:5")
    store.insert_events(
        [redelivered, TokenRecord(rollout_id="ro-2")], [(0, 5), (0, 6)], "tokens:0:5-6"
    )
    assert store.query("SELECT count() FROM tokens").rows == [(3,)]
    assert [e.rollout_id for e in store.read_events(TokenRecord)] == ["ro-1", "ro-2"]
    assert len(store.read_events(TokenRecord, final=False)) == 3
    assert store.read_events(
        TokenRecord, where="rollout_id = {r:String}", parameters={"r": "ro-1"}
    ) == [at_micros(first)]


def test_threads_insert_through_their_own_connections(store: Store) -> None:
    def insert(thread: int) -> None:
        for block in range(5):
            events = [
                TokenRecord(
                    rollout_id=f"t{thread}-b{block}-{i}",
                    completion_ids=pack_tokens(np.full(64, thread)),
                )
                for i in range(200)
            ]
            store.insert_events(
                events, [(thread, block * 200 + i) for i in range(200)], f"t{thread}:{block}"
            )

    threads = [threading.Thread(target=insert, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = store.query(
        "SELECT kafka_partition, count(), countIf(completion_ids[1] != kafka_partition) "
        "FROM tokens GROUP BY kafka_partition ORDER BY kafka_partition"
    ).rows
    assert rows == [(0, 1000, 0), (1, 1000, 0), (2, 1000, 0)]


def test_bad_input_is_refused_with_the_reason(store: Store) -> None:
    with pytest.raises(ValueError, match="one kind"):
        store.insert_events(
            [TokenRecord(rollout_id="a"), WeightLoaded(version=1, worker_id="w")],
            [(0, 0), (0, 1)],
            "x",
        )
    with pytest.raises(ValueError, match="2 events but 1"):
        store.insert_events([TokenRecord(rollout_id="a")] * 2, [(0, 0)], "x")
    with pytest.raises(ValueError, match=r"logprobs: row 0 holds 3 bytes"):
        store.insert_events([TokenRecord(rollout_id="a", logprobs=b"abc")], [(0, 0)], "x")
    assert store.insert_events([], [], "x") == 0


@pytest.mark.slow
def test_read_only_store_refuses_writes(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'data'}"
    with pytest.raises(StoreError, match="no store at"):
        open_store(url, read_only=True)
    open_store(url).close()
    with open_store(url, read_only=True) as reader:
        assert reader.query("SELECT count() FROM tokens").rows == [(0,)]
        with pytest.raises(StoreError, match="read-only"):
            reader.insert_events([TokenRecord(rollout_id="a")], [(0, 0)], "x")
        with pytest.raises(StoreError, match="DROP statements are refused"):
            reader.query("DROP TABLE tokens")
        assert reader.query_raw("SELECT 1 AS one FORMAT JSONEachRow") == b'{"one":1}\n'
