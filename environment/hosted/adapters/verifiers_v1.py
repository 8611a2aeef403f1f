"""verifiers V1 (0.4): a task set installed as a package (its module exports a `Taskset`
subclass, found the way `vf-eval NAME` finds it), run whole: each rollout is one V1 episode on
the task, played by the environment's own harness in its own runtime, scored by its own rewards.
Its model client points at the rollout's rlbus interception URL, so every model call is still
recorded by rlbus (tokens, log-probs, policy versions).

Args (env.toml `args`, or the CLI's): `taskset` (the taskset's config fields), `harness` and
`runtime` (the agent's, as `--env.agent.harness.*` / `--env.agent.runtime.*`), `env` (any other
V1 EnvConfig field, e.g. `{"timeout": {"episode": 120}}`)."""

from __future__ import annotations

import os
import ssl
from collections import defaultdict
from typing import Any

import httpx
import verifiers.v1 as vf
from verifiers.v1.clients import eval as v1_eval_client
from verifiers.v1.clients.base import DEFAULT_LIMITS
from verifiers.v1.env import RunSlot
from verifiers.v1.interception.server import InterceptionServer
from verifiers.v1.utils.loaders import load_environment, resolve_env_config

API_KEY_VAR = "HOSTED_ENDPOINT_TOKEN"
"""The variable V1's client reads its API key from: rlbus's interception URLs take any key."""

# Each rlbus rollout has a URL of its own, so V1's interception server (which keeps one client
# per distinct client config until serving ends) makes a client per rollout. Two costs follow,
# both measured by bench/environments.py: each httpx client loads the CA store into an SSL
# context of its own (~20 ms of CPU), and the clients pile up (~1 MB a rollout, for as long as
# the worker runs). So every client V1 makes here shares one SSL context, and a rollout's
# clients are dropped when it ends.
SHARED_TLS = ssl.create_default_context()
_made_for: dict[str, list[tuple[Any, str]]] = defaultdict(list)
"""base URL -> (interception server, its client key) of the clients made for that URL."""
_using: dict[str, int] = defaultdict(int)
"""base URL -> rollouts running against it (its clients are dropped when the last ends)."""
_server_client = InterceptionServer._client


def _httpx_client(config: Any) -> httpx.AsyncClient:
    timeout = httpx.Timeout(**config.timeout.model_dump())
    return httpx.AsyncClient(timeout=timeout, limits=DEFAULT_LIMITS, verify=SHARED_TLS)


def _tracked_client(server: Any, config: Any) -> Any:
    client = _server_client(server, config)
    _made_for[config.base_url].append((server, config.model_dump_json()))
    return client


async def _drop_clients(base_url: str) -> None:
    _using[base_url] -= 1
    if _using[base_url] > 0:
        return
    del _using[base_url]
    for server, key in _made_for.pop(base_url, []):
        client = server.clients.pop(key, None)
        if client is not None:
            await client.close()


v1_eval_client.build_async_httpx = _httpx_client
InterceptionServer._client = _tracked_client


def _messages(data: Any) -> list[dict[str, Any]]:
    prompt = data.prompt
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt:
        messages += [
            m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m) for m in prompt
        ]
    return messages


def _plain(value: Any) -> Any:
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


class Adapter:
    def __init__(self, target: str, args: dict[str, Any]):
        config: dict[str, Any] = {"taskset": {"id": target, **args.get("taskset", {})}}
        # V1's default runtime is remote (reached through a Prime tunnel); here the agent runs
        # beside its worker unless the args say otherwise.
        agent = {"runtime": {"type": "subprocess"}}
        agent.update({k: args[k] for k in ("harness", "runtime") if k in args})
        config["agent"] = agent
        config.update(args.get("env", {}))
        os.environ.setdefault(API_KEY_VAR, "rlbus")
        self.env = load_environment(resolve_env_config(config))
        self.serving: Any = None
        self.loaded: list[Any] = []
        self.source: Any = None

    async def describe(self) -> dict[str, Any]:
        self.serving = self.env.serving()
        await self.serving.__aenter__()
        return {
            "mode": "episode",
            "framework": f"verifiers {vf.__version__ if hasattr(vf, '__version__') else '0.4'}",
        }

    def _task(self, index: int) -> Any:
        # A V1 task set may be infinite: tasks are read as far as asked, once.
        if self.source is None:
            self.source = iter(self.env.taskset)
        while len(self.loaded) <= index:
            task = next(self.source, None)
            if task is None:
                raise IndexError(f"the task set has {len(self.loaded)} tasks, not {index + 1}")
            self.loaded.append(task)
        return self.loaded[index]

    async def tasks(self, split: str, start: int, count: int) -> list[dict[str, Any]]:
        rows = []
        for index in range(start, start + count):
            try:
                task = self._task(index)
            except IndexError:
                break
            data = task.data
            rows.append(
                {
                    "prompt": _messages(data),
                    "answer": str(getattr(data, "answer", "") or ""),
                    "info": {"hosted": {"index": index, "name": getattr(data, "name", None)}},
                }
            )
        return rows

    async def rollout(self, task: dict[str, Any], endpoint: dict[str, str]) -> dict[str, Any]:
        index = task["info"]["hosted"]["index"]
        client = vf.EvalClientConfig(base_url=endpoint["base_url"], api_key_var=API_KEY_VAR)
        ctx = vf.ModelContext(model=endpoint["model"], client=client)
        _using[endpoint["base_url"]] += 1
        try:
            episode = await self.env.run_slot(RunSlot(self._task(index)), ctx)
        finally:
            await _drop_clients(endpoint["base_url"])
        traces = list(episode.traces)
        rewards: dict[str, float] = {}
        metrics: dict[str, float] = {}
        for trace in traces:
            rewards.update({k: r.value for k, r in trace.rewards.items() if r is not None})
            metrics.update({k: v for k, v in trace.metrics.items() if v is not None})
        errors = [f"{e.type}: {e.message}" for e in episode.errors]
        errors += [f"{e.type}: {e.message}" for t in traces for e in t.errors]
        return {
            "reward": sum(t.reward for t in traces),
            "rewards": rewards,
            "metrics": metrics,
            "stop": next((t.stop_condition for t in traces if t.stop_condition), None),
            "error": "; ".join(errors) if not episode.ok and errors else None,
        }

    async def aclose(self) -> None:
        if self.serving is not None:
            await self.serving.__aexit__(None, None, None)
