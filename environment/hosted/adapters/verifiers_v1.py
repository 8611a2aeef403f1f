"""verifiers V1 (0.4): a task set installed as a package (its module exports a `Taskset`
subclass, found the way `vf-eval NAME` finds it), in one of two modes:

- `episode` (the default): each rollout is one V1 episode on the task, played by the
  environment's own harness in its own runtime, scored by its own rewards. Its model client
  points at the rollout's rlbus interception URL, so every model call is still recorded by rlbus
  (tokens, log-probs, policy versions).
- `steps`: rlbus's chat loop asks the task's prompt and its one reply is the answer; the task's
  own rewards, metrics and judges score that transcript, offline (as V1's `replay` rescores a
  trace). For task sets whose tasks are one question and one answer: no tools, no box to set up,
  nothing scored in a runtime; any other is refused when the worker loads it, naming why. V1's
  episode machinery (its interception server, harness and runtime) is not run at all.

Args (env.toml `args`, or the CLI's): `mode`, `taskset` (the taskset's config fields),
`harness` and `runtime` (the agent's, as `--env.agent.harness.*` / `--env.agent.runtime.*`),
`env` (any other V1 EnvConfig field, e.g. `{"timeout": {"episode": 120}}`)."""

from __future__ import annotations

import inspect
import os
import ssl
from collections import defaultdict
from typing import Any

import httpx
import verifiers.v1 as vf
from verifiers.v1.clients import eval as v1_eval_client
from verifiers.v1.clients.base import DEFAULT_LIMITS
from verifiers.v1.env import RunSlot
from verifiers.v1.envs.single_agent import SingleAgentEnv
from verifiers.v1.graph import MessageNode
from verifiers.v1.interception.server import InterceptionServer
from verifiers.v1.state import state_cls
from verifiers.v1.trace import TraceTask
from verifiers.v1.types import AssistantMessage, SystemMessage, UserMessage
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


MODES = ("episode", "steps")
BOX_HOOKS = ("setup", "finalize", "stage_verifier")
"""Task methods that work in the task's box: overridden, the task needs V1's runtime."""
PROMPT_MESSAGES = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}


def _needs_runtime(fn: Any) -> bool:
    """V1's own test (Task.score): a scorer that takes a runtime without a default."""
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _not_one_turn(env: Any, task: Any) -> str | None:
    """Why `env`'s tasks cannot be played as one chat turn scored offline (None: they can)."""
    taskset = env.taskset
    if type(env) is not SingleAgentEnv:
        return f"its environment is a {type(env).__name__}, not one agent on a task"
    if type(task).toolsets(taskset.config.task) or taskset.toolsets(taskset.config):
        return "its tasks have tools"
    boxed = [h for h in BOX_HOOKS if getattr(type(task), h) is not getattr(vf.Task, h)]
    if boxed:
        return f"its tasks work in a box ({', '.join(boxed)})"
    scorers = [*task.hooks("metric"), *task.hooks("reward")]
    in_runtime = [fn.__name__ for fn in scorers if _needs_runtime(fn)]
    in_runtime += [j.reward_name for j in task.plugged_judges() if _needs_runtime(j.score)]
    if in_runtime:
        return f"{', '.join(in_runtime)} score in a runtime"
    return None


def _append(nodes: list[Any], message: dict[str, Any], sampled: bool = False) -> None:
    """`message` as the next node of a transcript (its parent: the node before it)."""
    kind = PROMPT_MESSAGES.get(message.get("role", ""))
    if kind is None:
        raise ValueError(f"a {message.get('role')!r} message cannot be replayed to the task")
    nodes.append(
        MessageNode(
            parent=len(nodes) - 1 if nodes else None,
            message=kind(content=message.get("content") or ""),
            sampled=sampled,
        )
    )


def _reported(traces: list[Any], stop: str | None, error: str | None) -> dict[str, Any]:
    """What the worker reports of a rollout: its traces' total, their rewards and metrics."""
    rewards: dict[str, float] = {}
    metrics: dict[str, float] = {}
    for trace in traces:
        rewards.update({k: r.value for k, r in trace.rewards.items() if r is not None})
        metrics.update({k: v for k, v in trace.metrics.items() if v is not None})
    reward = sum(t.reward for t in traces)
    return {"reward": reward, "rewards": rewards, "metrics": metrics, "stop": stop, "error": error}


class Adapter:
    def __init__(self, target: str, args: dict[str, Any]):
        self.mode = args.get("mode", "episode")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: one of {', '.join(MODES)}")
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
        self.sessions: dict[str, tuple[Any, list[Any]]] = {}
        """steps: a rollout's task and its transcript so far, as V1 message nodes."""
        if self.mode == "steps" and (why := _not_one_turn(self.env, self._task(0))):
            raise ValueError(
                f"{target} cannot run in mode 'steps' (one chat turn, scored offline): {why}; "
                "run it in mode 'episode'"
            )

    async def describe(self) -> dict[str, Any]:
        if self.mode == "episode":
            self.serving = self.env.serving()
            await self.serving.__aenter__()
        return {
            "mode": self.mode,
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
        errors = [f"{e.type}: {e.message}" for e in episode.errors]
        errors += [f"{e.type}: {e.message}" for t in traces for e in t.errors]
        return _reported(
            traces,
            stop=next((t.stop_condition for t in traces if t.stop_condition), None),
            error="; ".join(errors) if not episode.ok and errors else None,
        )

    async def reset(self, session: str, task: dict[str, Any]) -> dict[str, Any]:
        v1_task = self._task(task["info"]["hosted"]["index"])
        nodes: list[Any] = []
        for message in task.get("prompt") or []:
            _append(nodes, message)
        self.sessions[session] = (v1_task, nodes)
        return {"observation": None}

    async def step(self, session: str, action: str) -> dict[str, Any]:
        """The model's reply is the answer: the episode is over."""
        _, nodes = self.sessions[session]
        _append(nodes, {"role": "assistant", "content": action}, sampled=True)
        return {"observation": None, "reward": 0.0, "done": True}

    async def close(self, session: str) -> dict[str, Any]:
        task, nodes = self.sessions.pop(session)
        trace = vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            state=state_cls(type(task))(),
            agent=vf.AgentInfo(config=vf.AgentConfig(), name="rlbus"),
            nodes=nodes,
        )
        await task.score(trace)
        return _reported([trace], "answered" if trace.assistant_messages else "no_reply", None)

    async def aclose(self) -> None:
        if self.serving is not None:
            await self.serving.__aexit__(None, None, None)
