"""Events: round trips, schema evolution in both directions, packed arrays, ids."""

from __future__ import annotations

import uuid

import msgspec
import numpy as np
import pytest

from rlbus.schemas import (
    EVENT_TYPES,
    TOPICS,
    DecodeError,
    Event,
    TaskPublished,
    TokenRecord,
    decode,
    derived_id,
    encode,
    key_of,
    topic_of,
    uuid7,
)
from rlbus.schemas.packed import logprobs, pack_logprobs, pack_tokens, tokens


def test_uuid7_is_version_7_and_time_ordered() -> None:
    ids = [uuid7() for _ in range(200)]
    assert all(uuid.UUID(i).version == 7 for i in ids)
    assert [i[:13] for i in ids] == sorted(
        i[:13] for i in ids
    )  # millisecond prefix never goes back
    assert len(set(ids)) == len(ids)


def test_derived_id_is_stable_and_distinct() -> None:
    assert derived_id("a", 1) == derived_id("a", 1)
    assert derived_id("a", 1) != derived_id("a", 2)
    assert uuid.UUID(derived_id("x")).version == 8


def test_every_kind_has_exactly_one_topic_and_a_table() -> None:
    kinds = [k for t in TOPICS for k in t.kinds]
    assert sorted(k.__name__ for k in kinds) == sorted(k.__name__ for k in EVENT_TYPES)
    assert len({k.table for k in EVENT_TYPES}) == len(EVENT_TYPES)
    for kind in EVENT_TYPES:
        fields = {f.name for f in msgspec.structs.fields(kind)}
        assert {"event_id", "schema_version", "ts", "run_id"} <= fields
        assert set(kind.order_by) <= fields
        assert topic_of(kind).key_field in fields


def test_packed_token_views_round_trip() -> None:
    ids = np.arange(1000, dtype=np.uint32) * 7
    lp = -np.linspace(0, 5, 1000, dtype=np.float32)
    record = TokenRecord(rollout_id="r", prompt_ids=pack_tokens(ids), logprobs=pack_logprobs(lp))
    back = decode("tokens", encode(record))
    assert isinstance(back, TokenRecord)
    np.testing.assert_array_equal(tokens(back.prompt_ids), ids)
    np.testing.assert_array_equal(logprobs(back.logprobs), lp)
    assert key_of(back) == b"r"


class TaskPublishedV2(Event, kw_only=True, tag="TaskPublished"):
    """What a newer producer might send: TaskPublished plus a field we do not know yet."""

    table = "tasks_v2"
    task_id: str
    env: str
    prompt: str
    difficulty: float = 0.5


class TaskPublishedV0(Event, kw_only=True, tag="TaskPublished"):
    """What an older producer might send: no answer/info/group_size/split yet."""

    table = "tasks_v0"
    task_id: str
    env: str
    prompt: str


def test_newer_producer_unknown_fields_are_ignored() -> None:
    newer = TaskPublishedV2(task_id="t", env="e", prompt="p", difficulty=0.9, schema_version=2)
    event = decode("tasks", msgspec.msgpack.encode(newer))
    assert isinstance(event, TaskPublished)
    assert (event.task_id, event.prompt, event.schema_version) == ("t", "p", 2)


def test_older_producer_missing_fields_get_defaults() -> None:
    older = TaskPublishedV0(task_id="t", env="e", prompt="p")
    event = decode("tasks", msgspec.msgpack.encode(older))
    assert isinstance(event, TaskPublished)
    assert (event.answer, event.info, event.group_size, event.split) == ("", {}, 0, "train")


def test_newer_reader_decodes_current_events() -> None:
    """The other direction: a reader with a newer schema reads today's events with defaults."""
    current = TaskPublished(task_id="t", env="e", prompt="p")
    newer = msgspec.msgpack.decode(encode(current), type=TaskPublishedV2)
    assert newer.difficulty == 0.5 and newer.event_id == current.event_id


def test_json_task_from_outside_client() -> None:
    raw = b'{"task_id": "j1", "env": "e", "prompt": [{"role": "user", "content": "hi"}]}'
    event = decode("tasks", raw, None, fallback_event_id=lambda: "fixed")
    assert isinstance(event, TaskPublished) and event.event_id == "fixed"
    assert event.prompt == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("topic", "raw", "content_type", "reason"),
    [
        ("tasks", b"\xc1\x00garbage", None, "undecodable msgpack"),
        (
            "rollouts",
            msgspec.msgpack.encode({"kind": "RolloutCompleted", "rollout_id": 3}),
            None,
            "invalid 'rollouts'",
        ),
        (
            "tasks",
            b'{"env": "e", "prompt": "p"}',
            "application/json",
            "missing required field `task_id`",
        ),
        ("tasks", b"[1, 2]", "application/json", "must be an object"),
        ("rollouts", b'{"rollout_id": "r"}', "application/json", "msgpack events only"),
    ],
)
def test_malformed_messages_have_readable_reasons(
    topic: str, raw: bytes, content_type: str | None, reason: str
) -> None:
    with pytest.raises(DecodeError, match=reason.replace("`", ".").replace("(", r"\(")):
        decode(topic, raw, content_type)
