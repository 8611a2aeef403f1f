"""Issue 13, finding 4: the claim-check header is not trusted. Hostile references published on
the real broker are dead-lettered with their reason, read nothing outside the claim store,
request nothing, and wedge no consumer; claims expire and are deleted."""

from __future__ import annotations

import asyncio
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import msgspec

from rlbus.bus import Bus, Delivery
from rlbus.bus.claim_check import HEADER, ClaimStore, ClaimStub
from rlbus.config import Settings
from rlbus.schemas import DeadLetter, TaskPublished, codec

KIND = ("rlbus-kind", b"TaskPublished")


async def collect(bus: Bus, group: str, topic: str, n: int, timeout_s: float) -> list[Delivery]:
    got: list[Delivery] = []
    stop = asyncio.Event()

    async def on_batch(batch: list[Delivery]) -> None:
        got.extend(batch)
        if len(got) >= n:
            stop.set()

    await asyncio.wait_for(
        bus.subscriber(topic, group=group, batch=True)(on_batch).run(stop), timeout_s
    )
    return got


class Counting(BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self) -> None:
        Counting.requests.append(self.path)
        body = json.dumps({"task_id": "from-http", "env": "e", "prompt": "p"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def stub(key: str, size: int) -> bytes:
    return msgspec.msgpack.encode(ClaimStub("TaskPublished", "e1", key, size))


async def test_hostile_claim_references_are_dead_lettered(
    settings: Settings, tmp_path: Path
) -> None:
    claims_dir = Path(settings.claim_check.url)
    outside = tmp_path / "outside.json"
    task = json.dumps({"task_id": "from-a-local-file", "env": "e", "prompt": "p"}).encode()
    outside.write_bytes(task)
    (claims_dir / "tasks").mkdir(parents=True)
    os.mkfifo(claims_dir / "tasks" / "fifo.msgpack")
    os.symlink("/dev/zero", claims_dir / "tasks" / "zero.msgpack")
    os.symlink(outside, claims_dir / "tasks" / "link.msgpack")
    (claims_dir / "tasks" / "short.msgpack").write_bytes(b"12")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/task.json"
    attacks = {
        "local file uri": (f"file://{outside}", len(task)),
        "absolute path": (str(outside), len(task)),
        "http url": (url, 60),
        "dot-dot": ("../" * 12 + "dev/zero", 1 << 20),
        "fifo": ("tasks/fifo.msgpack", 10),
        "link to /dev/zero": ("tasks/zero.msgpack", 1 << 20),
        "link outside": ("tasks/link.msgpack", len(task)),
        "over max_bytes": ("tasks/short.msgpack", 2 << 30),  # over the default 1 GiB
        "size mismatch": ("tasks/short.msgpack", 1000),
        "missing": ("tasks/never-written.msgpack", 10),
    }
    try:
        async with Bus.of(settings) as bus:
            for name, (reference, size) in attacks.items():
                headers = [
                    KIND,
                    ("content-type", b"application/json"),
                    (HEADER, reference.encode()),
                ]
                await bus.publish_raw(
                    "tasks", stub(reference, size), key=name.encode(), headers=headers
                )
            await bus.publish(TaskPublished(task_id="good", env="e", prompt="p"))
            got = await collect(bus, "env", "tasks", 1, 60)
            dead = await collect(bus, "ops", "dlq", len(attacks), 60)
    finally:
        server.shutdown()
        server.server_close()
    assert [d.event.task_id for d in got] == ["good"]  # type: ignore[attr-defined]
    errors = {}
    for d in dead:
        assert isinstance(d.event, DeadLetter)
        errors[d.event.key.decode()] = d.event.error
    assert set(errors) == set(attacks)
    for name in ("local file uri", "http url"):
        assert "has a scheme" in errors[name], errors[name]
    assert "absolute path" in errors["absolute path"]
    assert "'..' component" in errors["dot-dot"]
    # Refused as no regular file, not given up after claim_check.read_timeout_s: opening the
    # FIFO did not wait for a writer, so it wedged no reader.
    for name in ("fifo", "link to /dev/zero", "link outside"):
        assert "not" in errors[name] and "regular file" in errors[name], errors[name]
        assert "was not read within" not in errors[name], errors[name]
    assert "claim_check.max_bytes" in errors["over max_bytes"]
    assert "holds 2 bytes, its stub says 1000" in errors["size mismatch"]
    assert "expired after claim_check.retention_s" in errors["missing"]
    assert Counting.requests == []  # the http reference was never fetched


def test_publishers_write_keys_and_claims_expire(settings: Settings) -> None:
    claims = ClaimStore(settings.claim_check.model_copy(update={"retention_s": 3600.0}))
    event = TaskPublished(task_id="t", env="e", prompt="p")
    payload = codec.encode(event)
    old = claims.put("tasks", "old-event", payload)
    assert old == "tasks/old-event.msgpack"  # a key, not a URI
    assert claims.put("tasks", "../../escape", payload).startswith("tasks/")  # hashed, not a path
    path = Path(settings.claim_check.url) / old
    two_hours_ago = time.time() - 7200
    os.utime(path, (two_hours_ago, two_hours_ago))
    assert claims.get(old, len(payload)) == payload
    assert claims.sweep() == 1
    assert not path.exists()
    fresh = claims.put("tasks", "fresh-event", payload)
    assert claims.get(fresh, len(payload)) == payload  # within the retention: kept
