"""The Kafka bus against the real embedded broker: dead letters, JSON from outside clients,
claim check, commit-after-handle, trace context across the hop."""

from __future__ import annotations

import asyncio
from collections import Counter

import msgspec
import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from rlbus.bus import Bus, Delivery, telemetry
from rlbus.bus.claim_check import HEADER as CLAIM_HEADER
from rlbus.bus.topic_reader import read_back, read_records
from rlbus.config import Settings
from rlbus.schemas import (
    DeadLetter,
    RolloutCompleted,
    RolloutScored,
    TaskPublished,
    TokenRecord,
    TraceNode,
)
from rlbus.schemas.packed import pack_logprobs, pack_tokens


async def collect(
    bus: Bus, group: str, topics: list[str], n: int, timeout_s: float = 30, **kwargs: object
) -> list[Delivery]:
    """Consume until `n` deliveries arrived (fails on timeout)."""
    got: list[Delivery] = []
    stop = asyncio.Event()

    async def on_batch(batch: list[Delivery]) -> None:
        got.extend(batch)
        if len(got) >= n:
            stop.set()

    consume = bus.subscriber(*topics, group=group, batch=True, **kwargs)(on_batch)
    await asyncio.wait_for(consume.run(stop), timeout_s)
    return got


async def test_malformed_messages_go_to_dlq_and_consumer_goes_on(settings: Settings) -> None:
    async with Bus.of(settings) as bus:
        await bus.publish_raw("tasks", b"\xc1 garbage bytes", key=b"k1")
        await bus.publish_raw(
            "tasks", msgspec.msgpack.encode({"kind": "TaskPublished", "task_id": 7})
        )
        await bus.publish_raw(
            "tasks",
            b'{"env": "e", "prompt": "no id"}',
            headers=[("content-type", b"application/json")],
        )
        await bus.publish(TaskPublished(task_id="good", env="e", prompt="p"))
        got = await collect(bus, "env", ["tasks"], 1)
        assert [d.event.task_id for d in got] == ["good"]  # type: ignore[attr-defined]
        dead = await collect(bus, "ops", ["dlq"], 3)
    letters = [d.event for d in dead]
    assert all(isinstance(e, DeadLetter) and e.origin_topic == "tasks" for e in letters)
    by_raw = {e.raw: e for e in letters}  # type: ignore[attr-defined]
    garbage = by_raw[b"\xc1 garbage bytes"]
    assert garbage.key == b"k1" and "undecodable msgpack" in garbage.error
    wrong_shape = by_raw[msgspec.msgpack.encode({"kind": "TaskPublished", "task_id": 7})]
    assert "Expected `str`, got `int`" in wrong_shape.error and "task_id" in wrong_shape.error
    assert "missing required field `task_id`" in by_raw[b'{"env": "e", "prompt": "no id"}'].error
    assert all(e.consumer_group == "env" for e in letters)


async def test_handler_failure_dead_letters_only_that_event(settings: Settings) -> None:
    async with Bus.of(settings) as bus:
        await bus.publish_many(
            [TaskPublished(task_id=str(i), env="e", prompt="p") for i in range(10)]
        )
        handled: list[str] = []
        stop = asyncio.Event()

        async def on_event(d: Delivery) -> None:
            task = d.event
            assert isinstance(task, TaskPublished)
            if task.task_id == "3":
                raise RuntimeError("reward server said no")
            handled.append(task.task_id)
            if len(set(handled)) == 9:
                stop.set()

        await asyncio.wait_for(bus.subscriber("tasks", group="judge")(on_event).run(stop), 30)
        dead = await collect(bus, "ops", ["dlq"], 1)
    assert sorted(set(handled)) == sorted(str(i) for i in range(10) if i != 3)
    assert "RuntimeError: reward server said no" in dead[0].event.error  # type: ignore[attr-defined]


@pytest.mark.parametrize("batch", [False, True])
async def test_a_broker_error_in_a_handler_is_retried_not_dead_lettered(
    settings: Settings, batch: bool
) -> None:
    """Found in CI: Tansu answered NotLeaderForPartition to an env producer's publish for
    aiokafka's whole request timeout, and the task that rollout came from was dead-lettered, so
    3 of 16 rollouts were never made. The broker's refusal is not the event's fault: the
    handler runs again (its outputs have derived ids) and nothing reaches the dead letters."""
    from aiokafka.errors import NotLeaderForPartitionError

    async with Bus.of(settings) as bus:
        await bus.publish_many(
            [TaskPublished(task_id=str(i), env="e", prompt="p") for i in range(4)]
        )
        tries: Counter[str] = Counter()
        stop = asyncio.Event()

        async def on_events(deliveries: list[Delivery]) -> None:
            for d in deliveries:
                task = d.event
                assert isinstance(task, TaskPublished)
                tries[task.task_id] += 1
                if task.task_id == "2" and tries["2"] <= 2:
                    raise NotLeaderForPartitionError()
            if len(tries) == 4 and tries["2"] > 2:
                stop.set()

        async def on_event(d: Delivery) -> None:
            await on_events([d])

        handler = on_events if batch else on_event
        consume = bus.subscriber("tasks", group="env", batch=batch)(handler)  # type: ignore[arg-type]
        await asyncio.wait_for(consume.run(stop), 60)
        letters = await read_back(bus, "dlq", settings.run_id)
    assert tries["2"] == 3 and letters == []


async def test_json_task_from_plain_aiokafka_producer(settings: Settings) -> None:
    """An outside client with no rlbus code: plain JSON, no headers at all."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    async with Bus.of(settings) as bus:
        await bus.ensure_topics(["tasks"])
        await producer.start()
        try:
            await producer.send_and_wait(
                settings.kafka.topic_prefix + "tasks",
                b'{"task_id": "ext-1", "env": "reverse_text", "prompt": "olleh", '
                b'"answer": "hello"}',
            )
        finally:
            await producer.stop()
        got = await collect(bus, "env", ["tasks"], 1)
    task = got[0].event
    assert isinstance(task, TaskPublished)
    assert (task.task_id, task.env, task.prompt, task.answer) == (
        "ext-1",
        "reverse_text",
        "olleh",
        "hello",
    )
    assert task.event_id  # derived from its position, so a redelivery keeps it


async def test_five_mib_token_record_goes_through_claim_check(settings: Settings) -> None:
    n = 5 * 1024 * 1024 // 8  # 5 MiB of ids + log-probs
    rng = np.random.default_rng(0)
    big = TokenRecord(
        rollout_id="big",
        prompt_ids=pack_tokens(rng.integers(0, 50_000, n)),
        logprobs=pack_logprobs(rng.standard_normal(n)),
    )
    async with Bus.of(settings) as bus:
        await bus.publish(big)
        got = await collect(bus, "orchestrator", ["tokens"], 1)
    headers = dict(got[0].headers)
    assert headers[CLAIM_HEADER] == f"tokens/{big.event_id}.msgpack".encode()  # a key, no URL
    assert got[0].event == big


async def test_uncommitted_batch_is_redelivered_after_a_crash(settings: Settings) -> None:
    async with Bus.of(settings) as bus:
        await bus.publish_many(
            [
                RolloutCompleted(rollout_id=str(i), group_id="g", task_id="t", env="e")
                for i in range(5)
            ]
        )

        async def crash(batch: list[Delivery]) -> None:
            raise ConnectionError("store went away")

        with pytest.raises(ConnectionError):
            await asyncio.wait_for(
                bus.subscriber("rollouts", group="sinkish", batch=True, on_error="stop")(
                    crash
                ).run(),
                30,
            )
        got = await collect(bus, "sinkish", ["rollouts"], 5)
    assert sorted(d.event.rollout_id for d in got) == ["0", "1", "2", "3", "4"]  # type: ignore[attr-defined]


async def test_trace_context_crosses_the_broker(settings: Settings) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer(provider.get_tracer("rlbus-test"))
    try:
        async with Bus.of(settings) as bus:
            with provider.get_tracer("t").start_as_current_span("rollout") as root:
                await bus.publish(TaskPublished(task_id="traced", env="e", prompt="p"))
            stop = asyncio.Event()

            async def on_event(d: Delivery) -> None:
                stop.set()

            await asyncio.wait_for(bus.subscriber("tasks", group="env")(on_event).run(stop), 30)
    finally:
        telemetry.use_tracer(None)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["publish tasks"].kind == trace.SpanKind.PRODUCER
    assert spans["process tasks"].kind == trace.SpanKind.CONSUMER
    trace_id = root.get_span_context().trace_id
    assert spans["publish tasks"].context.trace_id == trace_id
    assert spans["process tasks"].context.trace_id == trace_id


async def test_held_message_is_not_committed_until_released(settings: Settings) -> None:
    """A handler that holds a message (a judge's incomplete group) gets it again after a
    restart, with everything after it on that partition; released ones are committed."""
    async with Bus.of(settings) as bus:
        await bus.publish_many(
            [
                RolloutCompleted(rollout_id=str(i), group_id="g", task_id="t", env="e")
                for i in range(6)
            ]
        )  # one key: one partition, in order
        stop = asyncio.Event()

        async def hold_the_third(batch: list[Delivery]) -> None:
            for d in batch:
                if d.event.rollout_id == "2":  # type: ignore[attr-defined]
                    d.hold()
            if any(d.event.rollout_id == "5" for d in batch):  # type: ignore[attr-defined]
                stop.set()

        await asyncio.wait_for(
            bus.subscriber("rollouts", group="judge", batch=True)(hold_the_third).run(stop), 30
        )
        again = await collect(bus, "judge", ["rollouts"], 4)
    assert [d.event.rollout_id for d in again] == ["2", "3", "4", "5"]  # type: ignore[attr-defined]


async def test_slow_event_neither_stalls_the_rest_nor_gets_committed(settings: Settings) -> None:
    """Per-event consumption keeps polling while a handler runs (an env producer's three-hour
    rollout): with 4 slots, one stuck event and 20 quick ones all get through; at stop the stuck
    one is cancelled, and a restart gets it again with everything after it on its partition."""
    async with Bus.of(settings) as bus:
        await bus.publish_many(
            [
                RolloutCompleted(rollout_id=str(i), group_id="g", task_id="t", env="e")
                for i in range(21)
            ]
        )  # one key: one partition, in order
        quick: list[str] = []
        stop = asyncio.Event()

        async def on_event(d: Delivery) -> None:
            rollout_id = d.event.rollout_id  # type: ignore[attr-defined]
            if rollout_id == "3":
                await asyncio.Event().wait()  # never finishes on its own
            quick.append(rollout_id)
            if len(quick) == 20:
                stop.set()

        await asyncio.wait_for(
            bus.subscriber("rollouts", group="env", concurrency=4)(on_event).run(stop), 30
        )
        again = await collect(bus, "env", ["rollouts"], 18)
    assert sorted(quick, key=int) == [str(i) for i in range(21) if i != 3]
    assert [d.event.rollout_id for d in again] == [str(i) for i in range(3, 21)]  # type: ignore[attr-defined]


async def test_reading_a_topic_back_always_starts_at_its_beginning(settings: Settings) -> None:
    """read_records seeks each partition to its start; the consumer's own reset to the latest
    offset (on assign) once raced that seek and won, and a restarting inference worker then saw
    no weights (1 read in ~60 came back empty with 20 at once)."""
    from rlbus.bus.topic_reader import read_records

    async with Bus.of(settings) as bus:
        await bus.publish(TaskPublished(task_id="t1", env="e", prompt=[], run_id=settings.run_id))
        for _ in range(5):
            reads = await asyncio.gather(*(read_records(bus, "tasks") for _ in range(20)))
            assert [len(records) for records in reads] == [1] * 20


async def test_a_rollouts_nodes_and_tokens_travel_as_one_message_each(settings: Settings) -> None:
    """Batched topics: what one publish holds of a rollout's trace nodes (and token records) is
    one message, encoded once; readers still see every event, numbered within its message."""
    nodes = [
        TraceNode(node_id=f"{r}-n{i}", rollout_id=r, index=i)
        for r in ("r1", "r2")
        for i in range(3)
    ]
    tokens = [TokenRecord(rollout_id="r1", call_index=i) for i in range(2)]
    scored = [RolloutScored(rollout_id=r, group_id="g", task_id="t", env="e") for r in ("r1", "r2")]
    async with Bus.of(settings) as bus:
        await bus.publish_many([*nodes, *tokens, *scored])
        records = {t: await read_records(bus, t) for t in ("trace-nodes", "tokens", "scored")}
        back = await read_back(bus, "trace-nodes", settings.run_id)
        got = await collect(bus, "readers", ["trace-nodes"], len(nodes))
    assert {t: len(r) for t, r in records.items()} == {"trace-nodes": 2, "tokens": 1, "scored": 2}
    assert sorted(n.node_id for n in back) == sorted(n.node_id for n in nodes)
    by_rollout: dict[str, list[tuple[Delivery, TraceNode]]] = {}
    for d in got:
        assert isinstance(d.event, TraceNode)
        by_rollout.setdefault(d.event.rollout_id, []).append((d, d.event))
    for rollout, pairs in by_rollout.items():
        assert [d.index for d, _ in pairs] == [0, 1, 2], rollout
        assert len({(d.partition, d.offset) for d, _ in pairs}) == 1  # one message
        assert [node.node_id for _, node in pairs] == [f"{rollout}-n{i}" for i in range(3)]
