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
from rlbus.schemas.ids import task_event_id
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


def test_unknown_fields_of_this_schema_version_are_ignored() -> None:
    """A field added without a version bump (additive, with a default) is skipped by older
    readers; a newer schema_version is refused, naming both versions, never read as this one
    with its fields dropped."""
    newer = TaskPublishedV2(task_id="t", env="e", prompt="p", difficulty=0.9)
    event = decode("tasks", msgspec.msgpack.encode(newer))
    assert isinstance(event, TaskPublished)
    assert (event.task_id, event.prompt, event.schema_version) == ("t", "p", 1)
    bumped = TaskPublishedV2(task_id="t", env="e", prompt="p", difficulty=0.9, schema_version=2)
    with pytest.raises(DecodeError, match="schema_version 2; this rlbus reads up to 1"):
        decode("tasks", msgspec.msgpack.encode(bumped))


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


def test_json_task_from_outside_client_takes_its_natural_key() -> None:
    """No id, no run: the default run, and an id from (run, env, task id), so the same task
    sent again (to a restarted broker, at the same offset or another) is the same event, and
    a different task at the same offset is a different one."""
    raw = b'{"task_id": "j1", "env": "e", "prompt": [{"role": "user", "content": "hi"}]}'
    event = decode("tasks", raw, None)
    assert isinstance(event, TaskPublished) and event.prompt == [{"role": "user", "content": "hi"}]
    assert event.run_id == "default"
    assert event.event_id == task_event_id("default", "e", "j1") == decode("tasks", raw).event_id
    other = decode("tasks", b'{"task_id": "j2", "env": "e", "prompt": "p", "run_id": "r"}')
    assert other.event_id == task_event_id("r", "e", "j2") != event.event_id


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
        ("tasks", b"[1, 2]", None, "must be an object, got a JSON list"),
        ("tasks", b"hello, broker", None, "the message is text"),
        ("tasks", b'{"task_id": "t", "env": "e", "prompt": "p", "group_size": -1}', None, ">= 0"),
        (
            "tasks",
            b'{"task_id": "t", "env": "e", "prompt": "p", "group_size": 18446744073709551616}',
            None,
            "group_size",
        ),
        (
            "rollouts",
            msgspec.msgpack.encode(
                {
                    "kind": "RolloutCompleted",
                    "rollout_id": "r",
                    "group_id": "g",
                    "task_id": "t",
                    "env": "e",
                    "num_turns": 2**63,
                }
            ),
            None,
            "num_turns",
        ),
        ("tasks", b'{"task_id": "t", "env": "e", "prompt": "p", "ts": 1e300}', None, "ts"),
        ("rollouts", b'{"rollout_id": "r"}', "application/json", "msgpack events only"),
    ],
)
def test_malformed_messages_have_readable_reasons(
    topic: str, raw: bytes, content_type: str | None, reason: str
) -> None:
    with pytest.raises(DecodeError, match=reason.replace("`", ".").replace("(", r"\(")):
        decode(topic, raw, content_type)
