"""Guess a number from 1 to 100: each guess is answered higher, lower or correct; reward 1 for
the guess that finds it; the episode ends then or when the tries run out."""

import random
from typing import Any
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from ..models import GuessAction, GuessObservation


class GuessEnvironment(Environment):
    # Each WebSocket session gets an instance of its own, and instances share nothing.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._target = 0
        self._tries_left = 0

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        target: int | None = None,
        max_tries: int = 7,
        **kwargs: Any,
    ) -> GuessObservation:
        """`target`: the number (else drawn from `seed`); `max_tries`: guesses allowed."""
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._target = target if target is not None else random.Random(seed).randint(1, 100)
        self._tries_left = max_tries
        return GuessObservation(
            message="I picked a number from 1 to 100. Guess it.", tries_left=max_tries
        )

    def step(
        self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any
    ) -> GuessObservation:  # type: ignore[override]
        self._state.step_count += 1
        self._tries_left -= 1
        guess = action.guess
        found = guess == self._target
        if found:
            message = f"{guess} is correct!"
        else:
            message = f"{guess} is too {'low' if guess < self._target else 'high'}."
        return GuessObservation(
            message=message,
            tries_left=self._tries_left,
            reward=1.0 if found else 0.0,
            done=found or self._tries_left <= 0,
        )

    @property
    def state(self) -> State:
        return self._state
