"""Discovery of a task set's tagged methods, and calling them with arguments injected by name."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlbus.environment.decorators import TAG, Kind, Tag

ROLLOUT_ARGS = frozenset(
    {"task", "prompt", "completion", "text", "answer", "info", "state", "rollout"}
)
"""What a reward or metric may ask for: `text` is the last assistant message's text, `rollout`
the RolloutCompleted event."""
GROUP_ARGS = frozenset(
    {"task", "prompt", "answer", "info", "group", "completions", "texts", "states", "rewards"}
)
"""What a group reward may ask for: per-rollout lists in sample order (`rewards` holds each
rollout's per-function rewards), plus the task's own fields."""
TOOL_ARGS = frozenset({"task", "state"})
USER_ARGS = frozenset({"task", "messages", "state", "turn"})
ALLOWED: dict[Kind, frozenset[str]] = {
    "reward": ROLLOUT_ARGS,
    "metric": ROLLOUT_ARGS,
    "group_reward": GROUP_ARGS,
    "tool": TOOL_ARGS,
    "user": USER_ARGS,
}


@functools.cache
def threads() -> ThreadPoolExecutor:
    """Threads for synchronous rules, apart from the event loop's default pool: rules that run
    past their timeout keep their thread until they return, and must not starve the rest of
    the process (store inserts, file reads) of threads."""
    return ThreadPoolExecutor(max_workers=32, thread_name_prefix="rlbus-rule")


class RuleError(TypeError):
    """A tagged method whose signature cannot be served."""


@dataclass(frozen=True)
class Rule:
    name: str
    kind: Kind
    weight: float
    fn: Callable[..., Any]
    injected: tuple[str, ...]
    """Parameters filled from what the caller has (task, state, ...)."""
    own: tuple[inspect.Parameter, ...] = ()
    """Tools only: the parameters the model supplies."""
    takes_all: bool = False

    @functools.cached_property
    def is_async(self) -> bool:
        method = type(self.fn).__call__  # async on an object such as an LLM judge
        return inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(method)

    def call(self, available: Mapping[str, Any], **own: Any) -> Any:
        """Call the rule here, with its arguments picked from `available`."""
        kwargs = dict(available) if self.takes_all else {p: available[p] for p in self.injected}
        return self.fn(**kwargs, **own)

    async def __call__(self, available: Mapping[str, Any], **own: Any) -> Any:
        """Run the rule. A synchronous one runs on a thread of its own pool, so a slow one
        (a long diff, a parser) neither blocks the event loop nor the timeouts of the others."""
        if self.is_async:
            return await self.call(available, **own)
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(
            threads(), functools.partial(self.call, available, **own)
        )
        return await result if inspect.isawaitable(result) else result


@dataclass
class Rules:
    rewards: list[Rule] = field(default_factory=list)
    metrics: list[Rule] = field(default_factory=list)
    group_rewards: list[Rule] = field(default_factory=list)
    tools: list[Rule] = field(default_factory=list)
    user: Rule | None = None

    @property
    def weights(self) -> dict[str, float]:
        return {r.name: r.weight for r in (*self.rewards, *self.group_rewards)}


def _rule(owner: str, attr: str, fn: Callable[..., Any], tag: Tag) -> Rule:
    allowed = ALLOWED[tag.kind]
    injected: list[str] = []
    own: list[inspect.Parameter] = []
    takes_all = False
    for param in inspect.signature(fn).parameters.values():
        if param.kind is param.VAR_KEYWORD:
            takes_all = tag.kind != "tool"
        elif param.name in allowed:
            injected.append(param.name)
        elif tag.kind == "tool":
            own.append(param)
        else:
            raise RuleError(
                f"{tag.kind} {owner}.{attr} asks for {param.name!r}; a {tag.kind} can ask for "
                f"{', '.join(sorted(allowed))}"
            )
    return Rule(tag.name or attr, tag.kind, tag.weight, fn, tuple(injected), tuple(own), takes_all)


def discover(obj: object) -> Rules:
    """The tagged methods of `obj` (bound), in definition order of the class hierarchy."""
    rules = Rules()
    owner = type(obj).__name__
    seen: set[str] = set()
    for klass in type(obj).__mro__:
        for attr, value in vars(klass).items():
            tag = getattr(value, TAG, None)
            if attr in seen or not isinstance(tag, Tag):
                continue
            seen.add(attr)
            rule = _rule(owner, attr, getattr(obj, attr), tag)
            if tag.kind == "user":
                if rules.user is not None:
                    raise RuleError(f"{owner} has two @user methods: {rules.user.name} and {attr}")
                rules.user = rule
            else:
                {
                    "reward": rules.rewards,
                    "metric": rules.metrics,
                    "group_reward": rules.group_rewards,
                    "tool": rules.tools,
                }[tag.kind].append(rule)
    names = [r.name for r in (*rules.rewards, *rules.metrics, *rules.group_rewards)]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise RuleError(f"{owner}: rewards and metrics need distinct names; repeated: {dup}")
    return rules
