"""The guessing game's action and observation."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class GuessAction(Action):
    """A guess."""

    guess: int = Field(..., ge=1, le=100, description="The number guessed, 1 to 100")


class GuessObservation(Observation):
    """What the last guess told."""

    message: str = Field(default="", description="higher, lower, or correct")
    tries_left: int = Field(default=0, description="Guesses left")
