"""Echo environment server components."""

from .echo_env_environment import EchoEnvironment

__all__ = ["EchoEnvironment"]
