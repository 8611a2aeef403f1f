"""The interception server: per-rollout model URLs speaking OpenAI chat, OpenAI Responses and
Anthropic messages, forwarding to an eval or train backend, recording every call as a trace."""

from rlbus.producers.interception.backends import EvalBackend, TokenBackend, make_backend
from rlbus.producers.interception.calls import Backend, CallResult, ModelCall, Prior, UpstreamError
from rlbus.producers.interception.server import InterceptionServer, RolloutSession
from rlbus.producers.interception.trace import Trace

__all__ = [
    "Backend",
    "CallResult",
    "EvalBackend",
    "InterceptionServer",
    "ModelCall",
    "Prior",
    "RolloutSession",
    "TokenBackend",
    "Trace",
    "UpstreamError",
    "make_backend",
]
