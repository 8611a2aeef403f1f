"""A verifiers environment (`verifiers:NAME`: an installed module with `load_environment`, as
`vf-eval NAME` loads it) as an rlbus task set.

- its dataset (the eval dataset for `eval_rows`) becomes tasks: the prompt verifiers formatted
  (system prompt and few-shot included), the answer, its info, and the whole row under
  info["verifiers"] so rewards see every column verifiers would give them;
- its rubric's functions become rules with their weights (weight 0 after the weighted ones: a
  metric; a function over plural arguments: a group reward), in verifiers' order, each called
  as verifiers calls it: with what its own rubric offers (parser and other class objects
  included), and scoring 0 if it raises; the state they see is rebuilt from the rollout, one
  per rollout and scoring;
- SingleTurnEnv runs in the `single` harness, ToolEnv in `tools` with its tools and max_turns,
  a MultiTurnEnv through a user turn that calls its `env_response` (setup_state first, its
  stop conditions before each reply); JSON-serializable state it sets travels in the rollout's
  state to the rewards.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rlbus.config import ConfigError
from rlbus.environment.decorators import Kind
from rlbus.environment.rules import Rule, Rules
from rlbus.environment.taskset import TaskSet
from rlbus.schemas import RolloutCompleted, TaskPublished, derived_id
from rlbus.schemas.chat import text_of

PREFIX = "verifiers:"
ROW = "verifiers"
"""info key holding the dataset row (every column but the prompt) and state key holding the
JSON-serializable state an environment set during the rollout."""
REBUILT = frozenset(
    {"input", "task", "prompt", "completion", "trajectory", "tool_defs", "timing", "client"}
    | {"model", "sampling_args", "trajectory_id", "usage", "usage_tracker"}
)
"""State keys rebuilt from the rollout; the others an environment sets are carried over."""
SAMPLING = ("temperature", "top_p", "max_tokens", "stop", "seed")
"""verifiers sampling_args that map onto rlbus's [env.sampling]."""
ROWS_PER_READ = 256
"""Dataset rows read at a time when making tasks."""


def _vf() -> Any:
    try:
        import verifiers
    except ImportError as exc:
        raise ConfigError(
            "verifiers environments need the verifiers package (pip install verifiers)"
        ) from exc
    return verifiers


def load(name: str, args: dict[str, Any]) -> Any:
    """verifiers' own loader, its failures as one line naming the environment."""
    vf = _vf()
    try:
        return vf.load_environment(name, **args)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise ConfigError(f"verifiers:{name}: {exc}") from exc


def _overrides(cls: type, base: type, *methods: str) -> list[str]:
    return [m for m in methods if getattr(cls, m, None) is not getattr(base, m, None)]


def harness_kind(env: Any) -> str:
    """The rlbus harness that runs it as verifiers would, or ConfigError saying what is not
    mapped yet."""
    vf = _vf()
    kind = type(env)
    unmapped = f"verifiers:{env.env_id or kind.__name__} is a {kind.__name__}"
    if isinstance(env, vf.StatefulToolEnv):
        raise ConfigError(f"{unmapped}: tools with injected state are not mapped yet")
    base = next(
        (b for b in (vf.SingleTurnEnv, vf.ToolEnv, vf.MultiTurnEnv) if isinstance(env, b)), None
    )
    if base is None:
        raise ConfigError(f"{unmapped}; rlbus runs SingleTurnEnv, ToolEnv and MultiTurnEnv")
    own = ["get_prompt_messages", "render_completion"]
    own += ["env_response", "call_tool"] if base is vf.ToolEnv else []
    if custom := _overrides(kind, base, *own):
        raise ConfigError(f"{unmapped} with its own {', '.join(custom)} (not mapped yet)")
    # A MultiTurnEnv's env_response plays the user in the single harness.
    return "tools" if base is vf.ToolEnv else "single"


def _openai_call(call: Any) -> dict[str, Any]:
    # verifiers keeps a call flat ({id, name, arguments}), and as a JSON string in saved results.
    call = json.loads(call) if isinstance(call, str) else call
    if "function" in call:
        return call
    function = {"name": call["name"], "arguments": call["arguments"]}
    return {"id": call["id"], "type": "function", "function": function}


def _plain(message: Any) -> dict[str, Any]:
    """A message as rlbus keeps it (OpenAI chat shape, no null fields)."""
    raw = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    out = {k: v for k, v in raw.items() if v is not None}
    if calls := out.get("tool_calls"):
        out["tool_calls"] = [_openai_call(c) for c in calls]
    return out


def plain_messages(messages: Any) -> list[dict[str, Any]]:
    """verifiers messages (pydantic or dicts) as OpenAI chat messages."""
    return [_plain(m) for m in messages]


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


class States:
    """The verifiers state each rollout's rules share while it is scored: built on first use
    from the rollout, kept for the rollout object (the Scorer hands every rule the same one),
    so a function that leaves something in state for the next works as in verifiers."""

    def __init__(self, env: Any, size: int = 4096):
        self.env = env
        self.size = size
        self._states: OrderedDict[int, tuple[RolloutCompleted, Any]] = OrderedDict()
        self._lock = threading.Lock()  # rules of different rollouts run on different threads

    def of(self, rollout: RolloutCompleted) -> Any:
        with self._lock:
            held = self._states.get(id(rollout))
        if held is not None and held[0] is rollout:
            return held[1]
        state = self.build(rollout.prompt, rollout.completion, rollout.info)
        state["trajectory_id"] = rollout.rollout_id
        state["model"] = rollout.model
        with self._lock:
            # Holding the rollout keeps its id from being reused while the entry lives.
            self._states[id(rollout)] = (rollout, state)
            while len(self._states) > self.size:
                self._states.popitem(last=False)
        return state

    def build(self, prompt: Any, completion: list[dict[str, Any]], info: dict[str, Any]) -> Any:
        """A state as verifiers' init_state and rollout loop leave it, from what rlbus stored."""
        vf = _vf()
        from verifiers.utils.message_utils import normalize_messages

        row = {**info.get(ROW, {}), "prompt": prompt}
        task = vf.flatten_task_input(json.loads(json.dumps(row)))
        state = vf.State(input=task)
        state["task"] = task
        state["prompt"] = normalize_messages(prompt, field_name="prompt")
        # verifiers types its messages; plain dicts are what it normalizes them from
        messages = normalize_messages(completion, field_name="completion")  # pyright: ignore[reportArgumentType]
        state["completion"] = messages
        history = list(state["prompt"])
        trajectory = []
        for message in messages:
            if message.role == "assistant":
                trajectory.append(
                    {
                        "prompt": list(history),
                        "completion": [message],
                        "response": None,
                        "tokens": None,
                        "reward": None,
                        "advantage": None,
                        "is_truncated": False,
                        "trajectory_id": "",
                        "extras": {},
                    }
                )
            history.append(message)
        state["trajectory"] = trajectory
        state["tool_defs"] = list(self.env.tool_defs or [])
        state["sampling_args"] = {}
        state.update(
            is_completed=True,
            is_truncated=False,
            stop_condition=None,
            error=None,
            final_env_response=None,
            reward=None,
            metrics=None,
            timing=vf.RolloutTiming(),
        )
        state.update(info.get("state", {}).get(ROW, {}))
        return state


def _leaves(rubric: Any) -> Iterator[tuple[Any, Callable[..., Any], float]]:
    """(owning rubric, function, weight) for every function of a rubric tree, in order."""
    vf = _vf()
    if isinstance(rubric, vf.RubricGroup):
        for inner in rubric.rubrics:
            yield from _leaves(inner)
        return
    if custom := _overrides(type(rubric), vf.Rubric, "score_rollout", "score_group"):
        raise ConfigError(f"{type(rubric).__name__} has its own {', '.join(custom)} (not mapped)")
    if rubric.has_advantages:
        raise ConfigError(f"{type(rubric).__name__} computes advantages (not mapped)")
    yield from ((rubric, f, w) for f, w in zip(rubric.funcs, rubric.weights, strict=True))


@dataclass
class _Function:
    """One rubric function as rlbus calls it, by verifiers' rule: with the parameters it names
    (everything when it takes **kwargs) out of its own rubric's objects; if it raises, the rubric
    logs it and it scores 0. A synchronous one runs on rlbus's rule threads, as any rule."""

    owner: Any
    func: Callable[..., Any]
    states: States
    group: bool

    def _objects(self, given: dict[str, Any]) -> dict[str, Any]:
        if self.group:
            return self.owner.group_score_objects([self.states.of(r) for r in given["group"]])
        return self.owner.score_objects(self.states.of(given["rollout"]))

    def _call(self, given: dict[str, Any]) -> Any:
        objects = self._objects(given)
        params = inspect.signature(self.func).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            objects = {k: v for k, v in objects.items() if k in params}
        return self.func(**objects)

    def _failed(self, exc: Exception, given: dict[str, Any]) -> Any:
        name = getattr(self.func, "__name__", repr(self.func))
        self.owner.logger.error(f"Error calling reward function {name}: {exc}")
        return [0.0] * len(given["group"]) if self.group else 0.0

    def sync(self, **given: Any) -> Any:
        try:
            result = self._call(given)
            result = asyncio.run(result) if inspect.isawaitable(result) else result
            return result if self.group else float(result)
        except Exception as exc:
            return self._failed(exc, given)

    async def coroutine(self, **given: Any) -> Any:
        try:
            result = await self._call(given)
            return result if self.group else float(result)
        except Exception as exc:
            return self._failed(exc, given)

    def rule(self, name: str, weight: float, kind: Kind) -> Rule:
        call = self.coroutine if inspect.iscoroutinefunction(self.func) else self.sync
        return Rule(name, kind, weight, call, (), (), True)


def reward_rules(rubric: Any, states: States) -> Rules:
    """A rubric's functions as rlbus rules with their weights; a function of the group is a
    group reward, one of weight 0 after the last weighted one a metric. (The scorer runs rewards,
    then metrics, then group rewards: verifiers' order, where a function may leave something in
    state for a later one, holds so.) A name used twice gets a suffix (_2, ...)."""
    rules = Rules()
    found = [
        (owner, func, weight, owner._is_group_func(func)) for owner, func, weight in _leaves(rubric)
    ]
    last_weighted = max((i for i, (_, _, w, g) in enumerate(found) if w and not g), default=-1)
    seen: dict[str, int] = {}
    for i, (owner, func, weight, group) in enumerate(found):
        base = getattr(func, "__name__", type(func).__name__)
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}_{seen[base]}"
        kind: Kind = "group_reward" if group else "metric" if i > last_weighted else "reward"
        rule = _Function(owner, func, states, group).rule(name, weight, kind)
        {"reward": rules.rewards, "metric": rules.metrics, "group_reward": rules.group_rewards}[
            kind
        ].append(rule)
    return rules


def tool_rules(env: Any) -> list[Rule]:
    """A ToolEnv's tools: their parameters are the schema, their results and errors reach the
    model as its call_tool and error_formatter make them."""
    from verifiers.utils.async_utils import maybe_await
    from verifiers.utils.tool_utils import is_valid_tool_content_parts

    rules = []
    for name, tool in env.tool_map.items():

        async def call(_tool: Any = tool, **arguments: Any) -> Any:
            try:
                result = await maybe_await(_tool, **arguments)
            except Exception as exc:
                return env.error_formatter(exc)
            return result if is_valid_tool_content_parts(result) else str(result)

        call.__doc__ = inspect.getdoc(tool)
        params = tuple(inspect.signature(tool).parameters.values())
        rules.append(Rule(name, "tool", 0.0, call, (), params))
    return rules


def env_response_rule(env: Any, states: States) -> Rule:
    """A MultiTurnEnv's env_response as the user turn: None (the rollout ends) once one of its
    stop conditions holds, else the text of the one user message it answers with."""

    async def reply(task: TaskPublished, messages: list[dict[str, Any]], state: dict, turn: int):
        from verifiers.utils.message_utils import normalize_messages

        n = len(task.prompt) if isinstance(task.prompt, list) else 1
        vf_state = states.build(messages[:n], messages[n:], {**task.info, "state": state})
        if turn == 0:
            await env.setup_state(vf_state)
        done = await env.is_completed(vf_state)
        history = [*vf_state["prompt"], *vf_state["completion"]]
        answer = [] if done else await env.env_response(history, vf_state)
        state[ROW] = {k: v for k, v in vf_state.items() if k not in REBUILT and _json_safe(v)}
        if done or vf_state.get("final_env_response") is not None:
            return None
        answer = plain_messages(normalize_messages(answer, field_name="env_response"))
        if [m["role"] for m in answer] != ["user"]:
            raise RuntimeError(
                f"env_response answered with {[m['role'] for m in answer]}; rlbus's user turn "
                "takes one user message (not mapped yet)"
            )
        return text_of(answer[0].get("content"))

    return Rule("env_response", "user", 0.0, reply, ("task", "messages", "state", "turn"))


def row_task(name: str, split: str, row: dict[str, Any]) -> TaskPublished:
    """A dataset row as a task: the formatted prompt, the answer, verifiers' info plus the row."""
    info = row.get("info") or {}
    info = json.loads(info) if isinstance(info, str) else dict(info)
    prompt = row["prompt"]
    prompt = prompt if isinstance(prompt, str) else plain_messages(prompt)
    answer = row.get("answer", "")
    columns = {k: v for k, v in row.items() if k != "prompt"}
    return TaskPublished(
        task_id=derived_id(PREFIX + name, split, row.get("example_id"), json.dumps(prompt)),
        env=name,
        prompt=prompt,
        answer=answer if isinstance(answer, str) else json.dumps(answer),
        info={**info, ROW: columns},
        split=split,
    )


class VerifiersTaskSet(TaskSet):
    """Base of the task set made for each `verifiers:NAME` (see `taskset_class`)."""

    vf_name = ""

    def __init__(self, **args: Any):
        super().__init__(**args)
        self.vf_env = env = load(self.vf_name, args)
        harness: dict[str, Any] = {"kind": harness_kind(env)}
        # verifiers' -1 (no limit) leaves rlbus's harness.max_turns.
        if env.max_turns > 0 and not isinstance(env, _vf().SingleTurnEnv):
            harness["max_turns"] = env.max_turns
        sampling = {k: env.sampling_args[k] for k in SAMPLING if k in env.sampling_args}
        self.defaults = {"harness": harness, "sampling": sampling}
        self.states = States(env)

    def adapted_rules(self) -> Rules:
        """The rules of what it loaded (the loader asks for these instead of tagged methods)."""
        rules = reward_rules(self.vf_env.rubric, self.states)
        if self.defaults["harness"]["kind"] == "tools":
            rules.tools = tool_rules(self.vf_env)
        elif not isinstance(self.vf_env, _vf().SingleTurnEnv):
            rules.user = env_response_rule(self.vf_env, self.states)
        return rules

    def _rows(self, split: str, dataset: Any) -> Iterator[TaskPublished]:
        # A datasets.Dataset read in column batches: its row iterator formats each row on its
        # own, which was half of what `rlbus eval` spent making a verifiers task.
        for batch in dataset.iter(batch_size=ROWS_PER_READ):
            names = list(batch)
            for values in zip(*batch.values(), strict=True):
                yield row_task(self.vf_name, split, dict(zip(names, values, strict=True)))

    def rows(self) -> Iterator[TaskPublished]:
        """The training dataset (its eval dataset when it has none)."""
        env = self.vf_env
        if env.dataset_source is None and env.dataset is None:
            return self._rows("test", env.get_eval_dataset())
        return self._rows("train", env.get_dataset())

    def eval_rows(self) -> Iterator[TaskPublished]:
        """The eval dataset (the training one when it has none), as `vf-eval` evaluates."""
        env = self.vf_env
        if env.eval_dataset_source is None and env.eval_dataset is None:
            return self.rows()
        return self._rows("test", env.get_eval_dataset())


@functools.cache
def taskset_class(name: str) -> type[VerifiersTaskSet]:
    """The task set of `verifiers:NAME` (one class per name, so loading twice gives the same)."""
    if not name:
        raise ConfigError("verifiers: names no environment (give verifiers:NAME)")
    return type(
        f"Verifiers_{name}", (VerifiersTaskSet,), {"name": name, "vf_name": name, "defaults": {}}
    )
