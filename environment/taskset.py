"""The base class of a task set: data plus rules (rewards, metrics, tools, a scripted user),
agent-agnostic. How it is run (harness, runtime, sampling) lives in EnvConfig."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, ClassVar

from rlbus.schemas import Messages, TaskPublished


class RolloutHookError(RuntimeError):
    """Raised by a task set's rollout hook (`prepare_rollout`, `check_rollout`): the rollout is
    recorded as an error of `kind` with this message, as a harness's failures are."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class TaskSet:
    """Subclass it, give `rows()`, and tag rewards with @reward / @metric / @group_reward.

    class ReverseText(TaskSet):
        def rows(self): ...
        @reward(weight=1.0)
        def exact(self, text, answer) -> float: return float(text.strip() == answer)
    """

    name: ClassVar[str] = ""
    """Environment id; unset: the class name in snake_case."""
    defaults: dict[str, Any] = {}
    """EnvConfig fields this task set wants by default (harness, group_size, ...); TOML and CLI
    win. Set on the class; an adapter that learns them on load (verifiers) sets them on the
    instance."""
    system_prompt: ClassVar[str | None] = None
    """Prepended to every task's prompt that has no system message."""

    def __init__(self, **args: Any):
        self.args = args

    @classmethod
    def env_id(cls) -> str:
        return cls.name or re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()

    def rows(self) -> Iterable[TaskPublished | dict[str, Any]]:
        """Tasks as TaskPublished or rows ({prompt, answer, info, ...}); may be infinite."""
        raise NotImplementedError(f"{type(self).__name__} must define rows()")

    def messages(self, task: TaskPublished) -> Messages:
        """The conversation a harness starts from."""
        prompt = (
            [{"role": "user", "content": task.prompt}]
            if isinstance(task.prompt, str)
            else list(task.prompt)
        )
        if self.system_prompt and not (prompt and prompt[0].get("role") == "system"):
            prompt.insert(0, {"role": "system", "content": self.system_prompt})
        return prompt

    async def prepare_rollout(self, rollout: Any) -> None:
        """Optional hook, called in the env producer once the rollout's sandbox is open and
        before the harness runs: set up what the agent starts from (files in
        `rollout.sandbox.workdir`, `rollout.sandbox.mount(...)`). `rollout` is the harness's
        `rlbus.producers.harnesses.Rollout`. Raising fails the rollout before the agent runs
        (RolloutHookError names the error kind). The default does nothing."""

    async def check_rollout(self, rollout: Any) -> None:
        """Optional hook, called after the harness returned and before the sandbox is closed:
        inspect or run what the agent left (`rollout.sandbox.run(...)`, a verifier program) and
        put what rewards need into `rollout.state`, which travels with the rollout to the
        scorer. Not called when the harness failed. Raising makes the rollout an error with the
        reason (RolloutHookError names the error kind). The default does nothing."""
