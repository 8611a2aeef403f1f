"""Echo environment (OpenEnv): echoes the message back."""

from .client import EchoEnv
from .models import EchoAction, EchoObservation

__all__ = ["EchoAction", "EchoEnv", "EchoObservation"]
