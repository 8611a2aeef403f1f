"""Guessing game server components."""

from .guess_env_environment import GuessEnvironment

__all__ = ["GuessEnvironment"]
