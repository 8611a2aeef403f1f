"""`rlbus asyncapi`: the AsyncAPI document FastStream generates covers every topic, key and
event, and real events validate against its schemas."""

from __future__ import annotations

import json

import jsonschema
import msgspec
import pytest
from support.factories import make_event
from typer.testing import CliRunner

from rlbus.cli import app
from rlbus.schemas import BY_NAME, EVENT_TYPES, TOPICS, TaskPublished


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("asyncapi") / "rlbus.json"
    result = CliRunner().invoke(app, ["asyncapi", "--out", str(out), "--kafka.topic-prefix", "x."])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def validator(document: dict, name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**document, "$ref": f"#/components/schemas/{name}"})


def test_every_topic_is_a_channel_with_its_key_and_events(document: dict) -> None:
    assert document["asyncapi"] == "3.0.0"
    assert document["defaultContentType"] == "application/msgpack"
    channels, messages = document["channels"], document["components"]["messages"]
    for topic in TOPICS:
        for channel in (topic.name, f"{topic.name}:publish"):
            assert channels[channel]["address"] == f"x.{topic.name}"
            assert channels[channel]["bindings"]["kafka"]["topic"] == f"x.{topic.name}"
        assert f"key: the event's `{topic.key_field}`" in channels[topic.name]["description"]
        for message in ("SubscribeMessage", "publish:Message"):
            key = messages[f"{topic.name}:{message}"]["bindings"]["kafka"]["key"]
            assert topic.key_field in key["description"]
    actions = {op["action"] for op in document["operations"].values()}
    assert actions == {"send", "receive"}


def test_every_event_validates_against_its_schema(document: dict) -> None:
    schemas = document["components"]["schemas"]
    assert {kind.__name__ for kind in EVENT_TYPES} <= set(schemas)
    for i, kind in enumerate(EVENT_TYPES):
        event = msgspec.json.decode(msgspec.json.encode(make_event(kind, i)))
        fields = {f.name for f in msgspec.structs.fields(kind)}
        assert set(schemas[kind.__name__]["properties"]) == {"kind", *fields}
        validator(document, kind.__name__).validate(event)
    weights = validator(document, "Weights")
    for kind in BY_NAME["weights"].kinds:
        weights.validate(msgspec.json.decode(msgspec.json.encode(make_event(kind, 0))))
    broken = msgspec.json.decode(msgspec.json.encode(make_event(TaskPublished, 0)))
    del broken["task_id"]
    with pytest.raises(jsonschema.ValidationError, match="task_id"):
        validator(document, "TaskPublished").validate(broken)


def test_a_batched_topics_message_is_one_event_or_an_array_of_them(document: dict) -> None:
    """What a rollout produces on trace-nodes and tokens travels as one message (a msgpack array
    of its events); the schema of the topic's messages says so, and still refuses a bad event."""
    for topic in (t for t in TOPICS if t.batched):
        (kind,) = topic.kinds
        name = "".join(w.title() for w in topic.name.split("-"))
        events = [msgspec.json.decode(msgspec.json.encode(make_event(kind, i))) for i in range(3)]
        messages = validator(document, name)
        messages.validate(events[0])
        messages.validate(events)
        broken = dict(events[1])
        del broken["rollout_id"]
        with pytest.raises(jsonschema.ValidationError):
            messages.validate([events[0], broken])
        payload = document["components"]["messages"][f"{topic.name}:SubscribeMessage"]["payload"]
        assert payload["$ref"].endswith(f"/{name}"), payload
