"""Decorators that only tag a task set's methods; `rules.discover` finds them by walking the class.

    @reward(weight=1.0)
    async def correct(self, text, answer) -> float: ...

Parameters are injected by name (see `rules.ARGUMENTS`), so a function asks for what it needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])

Kind = Literal["reward", "metric", "group_reward", "tool", "user"]
TAG = "__rlbus_tag__"


@dataclass(frozen=True)
class Tag:
    kind: Kind
    weight: float = 1.0
    name: str | None = None


def _tagger(kind: Kind, fn: Callable[..., Any] | None, weight: float, name: str | None) -> Any:
    def mark(f: F) -> F:
        setattr(f, TAG, Tag(kind, weight, name))
        return f

    return mark(fn) if fn is not None else mark


@overload
def reward(fn: F) -> F: ...
@overload
def reward(*, weight: float = 1.0, name: str | None = None) -> Callable[[F], F]: ...
def reward(
    fn: Callable[..., Any] | None = None, *, weight: float = 1.0, name: str | None = None
) -> Any:
    """A per-rollout reward; the rollout's reward is the weighted sum of all rewards."""
    return _tagger("reward", fn, weight, name)


@overload
def metric(fn: F) -> F: ...
@overload
def metric(*, name: str | None = None) -> Callable[[F], F]: ...
def metric(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """A per-rollout number that is recorded but adds nothing to the reward."""
    return _tagger("metric", fn, 0.0, name)


@overload
def group_reward(fn: F) -> F: ...
@overload
def group_reward(*, weight: float = 1.0, name: str | None = None) -> Callable[[F], F]: ...
def group_reward(
    fn: Callable[..., Any] | None = None, *, weight: float = 1.0, name: str | None = None
) -> Any:
    """Sees the whole group (once it is complete) and returns one score per rollout, in sample
    order."""
    return _tagger("group_reward", fn, weight, name)


@overload
def tool(fn: F) -> F: ...
@overload
def tool(*, name: str | None = None) -> Callable[[F], F]: ...
def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """A function the model may call in the `tools` harness; its docstring and typed parameters
    become the OpenAI function schema (injected parameters such as `state` are left out)."""
    return _tagger("tool", fn, 0.0, name)


def user(fn: F) -> F:
    """A scripted user: called after each assistant turn with no tool calls; returns the next user
    message, or None to end the rollout."""
    setattr(fn, TAG, Tag("user"))
    return fn
