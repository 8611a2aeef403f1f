"""Guess-the-number environment (OpenEnv)."""

from .client import GuessEnv
from .models import GuessAction, GuessObservation

__all__ = ["GuessAction", "GuessEnv", "GuessObservation"]
