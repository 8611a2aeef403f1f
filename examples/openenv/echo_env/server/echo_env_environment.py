"""The echo environment: each step echoes the message back, rewarded by its length (0.1 a
character, as OpenEnv's echo_env)."""

from typing import Any
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from ..models import EchoAction, EchoObservation


class EchoEnvironment(Environment):
    # Each WebSocket session gets an instance of its own, and instances share nothing.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._max_steps = 0

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        max_steps: int = 0,
        **kwargs: Any,
    ) -> EchoObservation:
        """`max_steps`: end the episode after that many steps (0: never)."""
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._max_steps = max_steps
        return EchoObservation(echoed_message="Echo environment ready!", reward=0.0)

    def step(
        self, action: EchoAction, timeout_s: float | None = None, **kwargs: Any
    ) -> EchoObservation:  # type: ignore[override]
        self._state.step_count += 1
        message = action.message
        return EchoObservation(
            echoed_message=message,
            message_length=len(message),
            reward=len(message) * 0.1,
            done=bool(self._max_steps) and self._state.step_count >= self._max_steps,
            metadata={"step": self._state.step_count},
        )

    @property
    def state(self) -> State:
        return self._state
