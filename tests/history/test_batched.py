"""Batched topics change the wire, not the history: a rollout's trace nodes and token records
published together as one message each land as exactly the rows (ids, contents, digests) they
land as when every event travels alone; an event the store refuses is dead-lettered with an id
of its own, even beside another refused event of the same message."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from store_helpers import broker_settings, sink_until
from support.factories import make_event

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.store import Store, open_store
from rlbus.bus.store.columns import columns_of
from rlbus.bus.topic_reader import read_records
from rlbus.schemas import (
    EVENT_TYPES,
    Event,
    RolloutCompleted,
    RolloutScored,
    TokenRecord,
    TraceNode,
)
from rlbus.schemas.packed import pack_tokens

ROLLOUTS = 40


@pytest.fixture
def broker() -> EmbeddedBroker:
    with EmbeddedBroker() as b:
        yield b


def rollouts(run_id: str) -> list[list[Event]]:
    """Each rollout's events as an env producer publishes them: its nodes, its token records,
    then the rollout and its score."""
    out = []
    for r in range(ROLLOUTS):
        rollout = make_event(RolloutCompleted, r, run_id)
        assert isinstance(rollout, RolloutCompleted)
        own = {"rollout_id": rollout.rollout_id}
        nodes = [
            msgspec.structs.replace(make_event(TraceNode, 100 * r + i, run_id), index=i, **own)
            for i in range(1 + r % 5)
        ]
        tokens = [
            msgspec.structs.replace(make_event(TokenRecord, 100 * r + i, run_id), **own)
            for i in range(r % 3)
        ]
        out.append([*nodes, *tokens, rollout, make_event(RolloutScored, r, run_id)])
    return out


def rows(store: Store) -> dict[str, list[tuple]]:
    """Every table's rows by what they say (event columns and the store's digest), not by
    where their messages sat."""
    out = {}
    for kind in EVENT_TYPES:
        names = ", ".join([c.name for c in columns_of(kind)] + ["digest"])
        sql = f"SELECT {names} FROM {kind.table} FINAL ORDER BY event_id"
        out[kind.table] = store.query(sql).rows
    return out


async def test_the_store_holds_the_same_rows_as_when_each_event_travels_alone(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    published = rollouts("same-run")
    stored = {}
    messages = {}
    for way in ("alone", "batched"):
        settings = broker_settings(broker, tmp_path / way / "store", prefix=f"{way}.")
        settings = settings.model_copy(update={"run_id": "same-run"})
        async with Bus.of(settings) as bus:
            for events in published:
                if way == "alone":  # the wire before batched topics: one message per event
                    for event in events:
                        await bus.publish_many([event])
                else:
                    await bus.publish_many(events)
            messages[way] = [len(await read_records(bus, t)) for t in ("trace-nodes", "tokens")]
        with open_store(settings.store.url) as store:
            await sink_until(settings, store, "SELECT count() FROM scored", ROLLOUTS)
            stored[way] = rows(store)
    events = [e for r in published for e in r]
    nodes = sum(isinstance(e, TraceNode) for e in events)
    tokens = sum(isinstance(e, TokenRecord) for e in events)
    assert messages == {"alone": [nodes, tokens], "batched": [ROLLOUTS, 2 * ROLLOUTS // 3]}
    assert len(stored["alone"]["trace_nodes"]) == nodes
    assert len(stored["alone"]["tokens"]) == tokens
    assert stored["batched"] == stored["alone"]


async def test_two_refused_events_of_one_message_get_letters_of_their_own(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = broker_settings(broker, tmp_path / "store")
    bad = b"\x01\x02\x03\x04\x05"  # not a whole number of uint32 token ids
    ids = [pack_tokens([0]), bad, pack_tokens([2]), bad]
    nodes = [TraceNode(node_id=f"n{i}", rollout_id="r", token_ids=t) for i, t in enumerate(ids)]
    async with Bus.of(settings) as bus:
        await bus.publish_many(nodes)
    with open_store(settings.store.url) as store:
        await sink_until(settings, store, "SELECT count() FROM dead_letters", 2)
        stored = store.query("SELECT node_id FROM trace_nodes FINAL ORDER BY node_id").rows
        letters = store.query(
            "SELECT event_id, origin_offset, error FROM dead_letters FINAL ORDER BY error"
        ).rows
    assert stored == [("n0",), ("n2",)]
    assert len({letter[0] for letter in letters}) == 2  # one id each, no conflict
    assert len({letter[1] for letter in letters}) == 1  # from the same message
    assert [letter[2].split(":")[0] for letter in letters] == [
        "event 1 of the message",
        "event 3 of the message",
    ]
    assert nodes[1].event_id in letters[0][2] and nodes[3].event_id in letters[1][2]
