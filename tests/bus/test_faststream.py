"""FastStream apps on rlbus topics (rlbus.bus.faststream) against the real embedded broker:
events rlbus publishes arrive decoded (msgpack, JSON, claim checks), what the app publishes is
byte-for-byte what rlbus publishes and rlbus's own consumers take it, failures become dead
letters, and a message is committed only after its handler finished."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from faststream.kafka import KafkaBroker
from faststream.security import BaseSecurity, SASLScram512
from support import ScriptedServer
from support.isolated import isolated_settings

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.claim_check import HEADER as CLAIM_HEADER
from rlbus.bus.faststream import FastStreamBus, broker_security
from rlbus.bus.records import CONTENT_TYPE, KIND, to_message
from rlbus.bus.store import open_store
from rlbus.bus.topic_reader import read_back, read_records
from rlbus.bus.waiting import wait_for
from rlbus.config import KafkaConfig, Settings, settings_variables
from rlbus.config.env import cli_overrides
from rlbus.discovery import store_served_elsewhere
from rlbus.environment import load_environment
from rlbus.launch.eval import run_eval
from rlbus.launch.processes import RoleProcess, alive
from rlbus.schemas import DeadLetter, RolloutScored, TaskPublished, TokenRecord
from rlbus.schemas.packed import pack_logprobs, pack_tokens

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def scored(rollout: str, reward: float = 1.0, run_id: str = "") -> RolloutScored:
    return RolloutScored(
        rollout_id=rollout, group_id="g", task_id="t", env="e", reward=reward, run_id=run_id
    )


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def serving(broker: KafkaBroker, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    await broker.start()
    try:
        await body()
    finally:
        await broker.stop()


async def committed(settings: Settings, group: str, topic: str) -> int:
    """Messages of `topic` that `group` committed past, over its partitions."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        group_id=settings.kafka.topic_prefix + group,
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        name = settings.kafka.topic_prefix + topic
        parts = range(settings.kafka.partitions)
        return sum([await consumer.committed(TopicPartition(name, p)) or 0 for p in parts])
    finally:
        await consumer.stop()


async def test_rlbus_events_arrive_typed_and_failures_are_dead_lettered(
    settings: Settings,
) -> None:
    run = settings.run_id
    big = TokenRecord(
        rollout_id="big",
        prompt_ids=pack_tokens(np.arange(300_000)),
        logprobs=pack_logprobs(np.zeros(300_000)),
    )
    async with Bus.of(settings) as bus:
        await bus.publish_many([scored("a"), scored("boom"), scored("other", run_id="other"), big])
        await bus.publish_raw("scored", b"\xc1 not an event", key=b"k")
        await bus.publish_raw(
            "tasks",
            b'{"task_id": "j1", "env": "e", "prompt": "hi"}',
            headers=[("content-type", b"application/json")],
        )
        await bus.publish_raw("tasks", b'{"task_id": "j2", "env": "e", "prompt": "no header"}')

    rl = FastStreamBus.of(settings)
    got: dict[str, list[Any]] = {"scored": [], "tokens": [], "tasks": []}

    @rl.subscriber("scored", group="alerts", run=run)
    async def on_scored(event: RolloutScored) -> None:
        if event.rollout_id == "boom":
            raise RuntimeError("the alert service is down")
        got["scored"].append(event)

    @rl.subscriber("tokens", group="archive", batch=True)
    async def on_tokens(events: list[TokenRecord]) -> None:
        got["tokens"].extend(events)

    @rl.subscriber("tasks", group="mirror", batch=True)
    async def on_tasks(events: list[TaskPublished]) -> None:
        got["tasks"].extend(events)

    async def body() -> None:
        await until(
            lambda: got["scored"] and got["tokens"] and len(got["tasks"]) == 2, "the events"
        )
        async with Bus.of(settings) as bus:
            letters = await read_back(bus, "dlq", run)
            while len(letters) < 2:
                await asyncio.sleep(0.2)
                letters = await read_back(bus, "dlq", run)
        by_raw = {letter.raw: letter for letter in letters if isinstance(letter, DeadLetter)}
        assert "undecodable msgpack" in by_raw[b"\xc1 not an event"].error
        boom = next(letter for letter in letters if b"boom" in letter.raw)
        assert "the alert service is down" in boom.error and boom.consumer_group == "alerts"
        assert boom.origin_topic == "scored"

    await serving(rl.broker, body)
    assert [e.rollout_id for e in got["scored"]] == ["a"]  # "other" is another run's
    assert got["tokens"][0].prompt_ids == big.prompt_ids  # resolved from the claim check
    assert sorted(t.task_id for t in got["tasks"]) == ["j1", "j2"]
    # Every message was committed past once handled or dead-lettered.
    assert await committed(settings, "alerts", "scored") == 4


async def test_published_events_are_what_rlbus_publishes_and_rlbus_consumes_them(
    settings: Settings,
) -> None:
    rl = FastStreamBus.of(settings)
    await rl.ensure_topics()
    event = scored("mine", reward=0.25)

    async def body() -> None:
        await rl.publish(event)

    await serving(rl.broker, body)
    async with Bus.of(settings) as bus:
        (record,) = await read_records(bus, "scored")
        (back,) = await read_back(bus, "scored", settings.run_id)
    expected = to_message(event, rl.claims)
    assert (record.key, record.value) == (expected.key, expected.value)
    headers = dict(record.headers)
    assert headers[CONTENT_TYPE] == b"application/msgpack"
    assert headers[KIND] == b"RolloutScored" and CLAIM_HEADER not in headers
    assert back == event and back.run_id == settings.run_id


async def test_a_message_is_committed_only_after_its_handler_finished(
    settings: Settings,
) -> None:
    async with Bus.of(settings) as bus:
        await bus.publish(scored("slow"))
    # A short graceful timeout: stopping cancels the hung handler, as a crash would end it.
    first = FastStreamBus.of(settings, graceful_timeout=0.2)
    started = asyncio.Event()

    @first.subscriber("scored", group="slow")
    async def never_finishes(event: RolloutScored) -> None:
        started.set()
        await asyncio.Event().wait()

    async def crash_mid_handler() -> None:
        await asyncio.wait_for(started.wait(), 30)

    await serving(first.broker, crash_mid_handler)
    again = FastStreamBus.of(settings)
    redelivered: list[str] = []

    @again.subscriber("scored", group="slow")
    async def finishes(event: RolloutScored) -> None:
        redelivered.append(event.rollout_id)

    async def body() -> None:
        await until(lambda: bool(redelivered), "the redelivery")

    await serving(again.broker, body)
    assert redelivered == ["slow"]


def test_example_app_scores_a_live_eval_and_rlbus_stores_its_scores(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """examples/faststream_app run with `faststream run` beside `rlbus eval`: it consumes the
    rollouts the eval publishes, and the sink (an rlbus role) stores the scores it publishes."""
    settings = isolated_settings(broker, tmp_path, flush_interval_s=0.1)
    sink = RoleProcess("sink", settings, tmp_path / "logs")
    log = tmp_path / "logs" / "app.log"
    env = {
        **os.environ,
        **settings_variables(settings),
        "ALERT_BELOW": "2",
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("wb") as out:
        app = subprocess.Popen(
            [sys.executable, "-m", "faststream", "run", "app:app"],
            cwd=EXAMPLES / "faststream_app",
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: store_served_elsewhere(settings), 60, "the sink", check=alive(sink))
        with ScriptedServer() as upstream:
            overrides = cli_overrides("scripted", f"{upstream.url}/v1", group_size=2)
            reverse_text = load_environment(str(EXAMPLES / "reverse_text"), overrides)
            result = run_eval(reverse_text, settings, n=4, show_progress=False)
        assert (result.tally.rollouts, result.tally.errors) == (8, 0)
        ours = "SELECT count() FROM scored FINAL WHERE run_id = {run:String}"
        scope = {"run": f"{result.run_id}+brevity"}

        def landed() -> bool:
            assert app.poll() is None, log.read_text()
            with open_store(settings.store.url, read_only=True) as store:
                return store.query(ours, scope).rows[0][0] == 8

        wait_for(landed, 60, "the app's 8 scores in the store", check=alive(sink))
        with open_store(settings.store.url, read_only=True) as store:
            rows = store.query(
                "SELECT r.completion, s.rewards['brevity'], s.metrics['completion_chars'] "
                "FROM (SELECT * FROM scored FINAL WHERE run_id = {run:String}) AS s "
                "INNER JOIN (SELECT * FROM rollouts FINAL) AS r USING rollout_id",
                scope,
            ).rows
        for completion, reward, chars in rows:
            said = "".join(m["content"] for m in json.loads(completion))
            assert chars == len(said) and reward == pytest.approx(1 / (1 + len(said) / 200))
        # The judge's rewards (at most 1.75 here) are all under the alert's threshold of 2.
        wait_for(
            lambda: log.read_text().count(f"(run {result.run_id}, task") == 8,
            30,
            "the app's alerts",
        )
    finally:
        app.terminate()
        try:
            app.wait(15)
        except subprocess.TimeoutExpired:
            app.kill()
            app.wait()
        sink.stop()


def test_faststream_connects_with_the_same_tls_and_sasl_settings_as_rlbus() -> None:
    assert broker_security(KafkaConfig(bootstrap_servers="h:9092")) is None
    tls = broker_security(KafkaConfig(bootstrap_servers="h:9093", security_protocol="SSL"))
    assert type(tls) is BaseSecurity and tls.use_ssl
    sasl = broker_security(
        KafkaConfig(
            bootstrap_servers="h:9094",
            security_protocol="SASL_SSL",
            sasl_username="rlbus",
            sasl_password="not-printed",
        )
    )
    assert isinstance(sasl, SASLScram512) and sasl.use_ssl and sasl.username == "rlbus"
    with pytest.raises(ValueError, match="kafka.sasl_username"):
        broker_security(KafkaConfig(bootstrap_servers="h:9094", security_protocol="SASL_PLAINTEXT"))
