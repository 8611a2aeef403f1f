"""Attacks on rollout isolation, run against the real components: small agent programs (Python)
started by the real runtimes through the `command` harness, talking to the real interception
server in front of a scripted upstream on 127.0.0.1. Nothing here is mocked but the model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from rlbus.environment import load_environment
from rlbus.producers.interception import EvalBackend, InterceptionServer
from rlbus.producers.rollouts import RolloutOutput, RolloutRunner

TASKSET = """
from rlbus.environment import TaskSet, reward

class Probe(TaskSet):
    name = "probe"

    def rows(self):
        return [{"task_id": "probe", "prompt": "hello", "answer": ""}]

    @reward
    def nothing(self) -> float:
        return 0.0
"""

CLIENT = """
import json, os, sys, time, urllib.request

def chat(base_url, text, timeout=10):
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    request = urllib.request.Request(
        base_url + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)["choices"][0]["message"]["content"]
"""
"""Prepended to every agent program: one chat call with the standard library only."""


async def run_agent(
    tmp_path: Path,
    upstream_url: str,
    program: str,
    *,
    group_size: int = 1,
    runtime: dict[str, Any] | None = None,
    harness: dict[str, Any] | None = None,
) -> list[RolloutOutput]:
    """One task's group of rollouts of `program` (CLIENT prepended) through the command harness."""
    (tmp_path / "env.py").write_text(TASKSET)
    (tmp_path / "agent.py").write_text(CLIENT + program)
    env = load_environment(
        str(tmp_path / "env.py"),
        {
            "group_size": group_size,
            "model": {"name": "scripted", "base_url": f"{upstream_url}/v1"},
            "harness": {
                "kind": "command",
                "command": ["{python}", "{env_dir}/agent.py"],
                **(harness or {}),
            },
            "runtime": runtime or {},
        },
    )
    async with InterceptionServer(EvalBackend(env.config.model), env.config.sampling) as server:
        return await RolloutRunner(env, server).run_group(next(iter(env.tasks("r"))))


def report(out: RolloutOutput) -> dict[str, Any]:
    """The JSON line an agent program printed last."""
    lines = out.rollout.info["state"]["stdout"].strip().splitlines()
    assert lines, f"no output; rollout error: {out.rollout.error}"
    return json.loads(lines[-1])


def processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() not in (entry / "cmdline").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


def kill_all(pids: list[int]) -> None:
    """Leftovers of a failed test, so they do not outlive it."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main() -> None:
    """`python security_agents.py SPEC_JSON`: run_agent in a process of its own (whose environment
    is its very first one, as /proc/PID/environ shows it) and print each rollout's report."""
    spec = json.loads(sys.argv[1])
    outs = asyncio.run(
        run_agent(
            Path(spec["tmp_path"]),
            spec["upstream"],
            spec["program"],
            runtime=spec.get("runtime"),
            harness=spec.get("harness"),
        )
    )
    print(json.dumps([{"error": o.rollout.error, **report(o)} for o in outs]))


if __name__ == "__main__":
    main()
