"""Kafka clients other than rlbus's own against the embedded broker (docs/kafka-clients.md):
confluent-kafka and kcat publish JSON tasks that the sink stores and read rlbus's events back;
Debian's kcat on its librdkafka 2.0.2 cannot connect at all."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from support.isolated import isolated_settings, running_sink

from rlbus.bus import Bus, EmbeddedBroker
from rlbus.bus.records import CONTENT_TYPE
from rlbus.bus.store import open_store
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings
from rlbus.schemas import TaskPublished, codec, decode

KCAT = shutil.which("kcat")


@pytest.fixture(scope="module")
def settings(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    root = tmp_path_factory.mktemp("clients")
    settings = isolated_settings(broker, root, flush_interval_s=0.1)
    with running_sink(settings, root / "logs"):
        asyncio.run(_ensure_topics(settings))
        yield settings


async def _ensure_topics(settings: Settings) -> None:
    async with Bus.of(settings) as bus:
        await bus.ensure_topics(["tasks"])


def stored_tasks(settings: Settings, run: str, n: int) -> list[tuple]:
    sql = (
        "SELECT task_id, env, prompt, answer FROM tasks FINAL WHERE run_id = {run:String} "
        "ORDER BY task_id"
    )

    def landed() -> bool:
        with open_store(settings.store.url, read_only=True) as store:
            return len(store.query(sql, {"run": run}).rows) >= n

    wait_for(landed, 60, f"{n} tasks of run {run} in the store")
    with open_store(settings.store.url, read_only=True) as store:
        return store.query(sql, {"run": run}).rows


def json_task(task_id: str, run: str) -> bytes:
    task = {"task_id": task_id, "env": "reverse_text", "prompt": "olleh", "answer": "hello"}
    return json.dumps({**task, "run_id": run}).encode()


def test_confluent_kafka_publishes_json_tasks_and_reads_rlbus_events(settings: Settings) -> None:
    run = f"confluent-{uuid.uuid4().hex[:6]}"
    tasks = settings.kafka.topic_prefix + "tasks"
    producer = confluent_kafka.Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    producer.produce(tasks, json_task("c1", run), headers={"content-type": "application/json"})
    producer.produce(tasks, json_task("c2", run), key=b"c2")  # no headers: sniffed as JSON
    assert producer.flush(30) == 0
    assert stored_tasks(settings, run, 2) == [
        ("c1", "reverse_text", '"olleh"', "hello"),  # the prompt column holds JSON
        ("c2", "reverse_text", '"olleh"', "hello"),
    ]

    # And the other way: a consumer-group member reads an event rlbus published (msgpack).
    ours = TaskPublished(task_id="from-rlbus", env="e", prompt="p", run_id=run)
    asyncio.run(_publish(settings, [ours]))
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": settings.kafka.topic_prefix + "confluent-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([tasks])
    try:
        seen: dict[str, TaskPublished] = {}
        wait_for(lambda: _poll_into(consumer, seen) and "from-rlbus" in seen, 60, "the event")
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert seen["from-rlbus"] == ours


async def _publish(settings: Settings, events: list[TaskPublished]) -> None:
    async with Bus.of(settings) as bus:
        await bus.publish_many(events)


def _poll_into(consumer: confluent_kafka.Consumer, seen: dict[str, TaskPublished]) -> bool:
    message = consumer.poll(0.5)
    if message is None:
        return True
    assert message.error() is None, message.error()
    content_type = dict(message.headers() or ()).get("content-type")
    event = decode("tasks", message.value(), content_type.decode() if content_type else None)
    assert isinstance(event, TaskPublished)
    seen[event.task_id] = event
    return True


def test_a_key_lands_on_the_partition_the_java_client_would_pick(settings: Settings) -> None:
    """librdkafka's murmur2_random partitioner is the Java client's default: a key rlbus
    publishes must share its partition with the same key from any other client, or per-key
    order (a group's rollouts, a rollout's tokens) would not hold across producers."""
    run = f"partitions-{uuid.uuid4().hex[:6]}"
    tasks = settings.kafka.topic_prefix + "tasks"
    keys = [f"{run}-{i}" for i in range(40)]
    theirs: dict[str, int] = {}
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "partitioner": "murmur2_random"}
    )
    for key in keys:
        producer.produce(
            tasks,
            json_task(key, run),
            key=key.encode(),
            on_delivery=lambda err, msg: theirs.__setitem__(msg.key().decode(), msg.partition()),
        )
    assert producer.flush(30) == 0
    events = [TaskPublished(task_id=key, env="e", prompt="p", run_id=run) for key in keys]
    asyncio.run(_publish(settings, events))

    ours: dict[str, int] = {}
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": settings.kafka.topic_prefix + run,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([tasks])
    try:
        wait_for(lambda: _poll_rlbus_keys(consumer, ours) and ours.keys() >= set(keys), 60, "keys")
    finally:
        consumer.close()
    assert {key: ours[key] for key in keys} == theirs
    assert len(set(theirs.values())) == settings.kafka.partitions  # the keys spread over all


def _poll_rlbus_keys(consumer: confluent_kafka.Consumer, ours: dict[str, int]) -> bool:
    """Each rlbus-published (msgpack) message's key and partition."""
    message = consumer.poll(0.5)
    if message is None or message.error() is not None:
        return True
    if dict(message.headers() or ()).get(CONTENT_TYPE) == codec.MSGPACK.encode():
        ours[message.key().decode()] = message.partition()
    return True


def bundled_librdkafka(tmp_path: Path) -> Path:
    """A folder whose librdkafka.so.1 is the one confluent-kafka's wheel ships (2.16)."""
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    (lib,) = libs.glob("librdkafka-*.so.1")
    (tmp_path / "librdkafka.so.1").symlink_to(lib)
    return tmp_path


def kcat(
    args: list[str], data: bytes = b"", lib: Path | None = None
) -> subprocess.CompletedProcess:
    env = {"LD_LIBRARY_PATH": str(lib)} if lib else {}
    assert KCAT is not None, "kcat is not installed (apt-get install kcat; .ci/run does)"
    return subprocess.run(
        [KCAT, *args], input=data, capture_output=True, timeout=60, env=env, check=False
    )


def test_kcat_on_librdkafka_2_16_publishes_and_consumes(settings: Settings, tmp_path: Path) -> None:
    lib = bundled_librdkafka(tmp_path)
    version = kcat(["-V"], lib=lib).stdout.decode()
    assert "librdkafka 2.16" in version, version
    run = f"kcat-{uuid.uuid4().hex[:6]}"
    bootstrap = settings.kafka.bootstrap_servers or ""
    tasks = settings.kafka.topic_prefix + "tasks"
    with_header = ["-P", "-b", bootstrap, "-t", tasks, "-H", "content-type=application/json"]
    published = kcat(with_header, json_task("k1", run) + b"\n", lib)
    assert published.returncode == 0, published.stderr
    published = kcat(["-P", "-b", bootstrap, "-t", tasks], json_task("k2", run) + b"\n", lib)
    assert published.returncode == 0, published.stderr
    assert [row[0] for row in stored_tasks(settings, run, 2)] == ["k1", "k2"]
    consumed = kcat(["-C", "-b", bootstrap, "-t", tasks, "-e", "-q", "-f", "%s\n"], lib=lib)
    assert consumed.returncode == 0, consumed.stderr
    assert json_task("k1", run) in consumed.stdout.splitlines()


def test_debian_kcat_on_librdkafka_2_0_2_cannot_connect(settings: Settings) -> None:
    version = kcat(["-V"]).stdout.decode()
    if "librdkafka 2.0.2" not in version:
        pytest.skip(f"the system kcat is not the one this documents: {version.strip()}")
    result = kcat(["-L", "-b", settings.kafka.bootstrap_servers or "", "-m", "2"])
    # Tansu 0.6.0 answers ApiVersions v3 with tagged fields librdkafka 2.0.2 cannot parse.
    assert result.returncode == 1
    assert b"ApiVersionRequest failed: Local: Read underflow" in result.stderr
