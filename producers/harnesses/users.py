"""User simulators: who answers the model when it ends a turn without tool calls. Scripted (a
task set's @user method) or model-driven (another model, through the `openai` client, seeing the
conversation from the user's side)."""

from __future__ import annotations

import os
from typing import Any, Protocol

import openai

from rlbus.config.env import UserModelConfig
from rlbus.environment.rules import Rule
from rlbus.producers.harnesses.base import Rollout
from rlbus.schemas import Messages
from rlbus.schemas.chat import text_of


class UserSimulator(Protocol):
    async def reply(self, rollout: Rollout, messages: Messages, turn: int) -> str | None:
        """The next user message, or None to end the rollout."""
        ...


class ScriptedUser:
    def __init__(self, rule: Rule):
        self.rule = rule

    async def reply(self, rollout: Rollout, messages: Messages, turn: int) -> str | None:
        return await self.rule(rollout.available(messages=messages, turn=turn))


_SWAP = {"user": "assistant", "assistant": "user"}


class ModelUser:
    def __init__(self, config: UserModelConfig):
        self.config = config
        self.client = openai.AsyncOpenAI(
            base_url=config.base_url, api_key=os.environ.get(config.api_key_env) or "rlbus-local"
        )

    async def reply(self, rollout: Rollout, messages: Messages, turn: int) -> str | None:
        persona = rollout.task.info.get("user", "")
        system = f"{self.config.instructions}\n\n{persona}".strip()
        # The simulator plays the user, so the conversation is shown to it with roles swapped.
        seen: list[dict[str, Any]] = [{"role": "system", "content": system}] + [
            {"role": _SWAP[m["role"]], "content": text_of(m.get("content"))}
            for m in messages
            if m.get("role") in _SWAP and text_of(m.get("content"))
        ]
        # plain message dicts: openai's TypedDicts describe the same JSON
        response = await self.client.chat.completions.create(model=self.config.name, messages=seen)  # type: ignore[arg-type]
        text = (response.choices[0].message.content or "").strip()
        return None if not text or text == self.config.done else text
