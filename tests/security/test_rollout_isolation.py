"""Finding 2: rollouts reached each other. An agent program read its siblings' base URLs from
/proc/<pid>/environ and posted into their traces; nothing stopped it reaching the rest of the
machine's loopback (the broker included). Run with the default runtime for `command` harnesses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from security_agents import report, run_agent
from support import ScriptedServer

from rlbus.bus import EmbeddedBroker

STEAL = """
own = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
chat(own + "/v1", "my own call")
time.sleep(1.5)  # every sibling is running by now
stolen = set()
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        variables = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
    except OSError:
        continue
    for variable in variables:
        name, _, value = variable.decode(errors="replace").partition("=")
        root = value.removesuffix("/v1")
        if name in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL") and root != own:
            stolen.add(root + "/v1")
posted = 0
for url in sorted(stolen):
    try:
        chat(url, "FOREIGN message from a sibling", timeout=3)
        posted += 1
    except Exception:
        pass
time.sleep(1.5)  # stay visible to siblings still scanning
print(json.dumps({"stolen": sorted(stolen), "posted": posted}))
"""


@pytest.mark.slow
async def test_siblings_cannot_read_each_others_urls_or_post_into_their_traces(
    tmp_path: Path, upstream: ScriptedServer
) -> None:
    outs = await run_agent(tmp_path, upstream.url, STEAL, group_size=4)
    assert [o.rollout.status for o in outs] == ["ok"] * 4, [o.rollout.error for o in outs]
    foreign = [
        n.rollout_id for o in outs for n in o.nodes if "FOREIGN" in str(n.message.get("content"))
    ]
    stolen = [report(o)["stolen"] for o in outs]
    assert foreign == [] and stolen == [[]] * 4, (foreign, stolen)
    # Each rollout's trace holds its own call only: the prompt and the model's answer.
    assert [sum(n.sampled for n in o.nodes) for o in outs] == [1] * 4


PROBE = """
import socket
own = os.environ["OPENAI_BASE_URL"]
answer = chat(own, "reachable?")
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
commands = []
for pid in pids:
    try:
        commands.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
    except OSError:
        pass
reached = {}
for name, address in json.loads(os.environ["PROBE_ADDRESSES"]).items():
    try:
        socket.create_connection(tuple(address), timeout=2).close()
        reached[name] = "connected"
    except OSError as exc:
        reached[name] = type(exc).__name__
print(json.dumps({"answer": answer, "commands": commands, "reached": reached}))
"""


async def test_the_sandbox_sees_no_other_process_and_reaches_only_its_own_url(
    tmp_path: Path, upstream: ScriptedServer, broker: EmbeddedBroker
) -> None:
    host, port = broker.bootstrap_servers.rsplit(":", 1)
    addresses = {
        "broker": [host, int(port)],
        "upstream": ["127.0.0.1", int(upstream.url.rsplit(":", 1)[1])],
        "internet": ["1.1.1.1", 53],
    }
    (out,) = await run_agent(
        tmp_path, upstream.url, PROBE, harness={"env": {"PROBE_ADDRESSES": json.dumps(addresses)}}
    )
    assert out.rollout.status == "ok", out.rollout.error
    seen = report(out)
    assert seen["answer"]  # its own URL answers
    assert all(outcome != "connected" for outcome in seen["reached"].values()), seen["reached"]
    # Only the sandbox's own processes: its init (bubblewrap) and the program, nothing else.
    assert len(seen["commands"]) <= 2, seen["commands"]
    assert all("agent.py" in c for c in seen["commands"]), seen["commands"]
