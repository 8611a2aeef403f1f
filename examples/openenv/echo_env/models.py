"""The echo environment's action and observation."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class EchoAction(Action):
    """A message to echo back."""

    message: str = Field(..., description="Message to echo back")


class EchoObservation(Observation):
    """The echoed message and its length."""

    echoed_message: str = Field(default="", description="The echoed message")
    message_length: int = Field(default=0, description="Length of the echoed message")
