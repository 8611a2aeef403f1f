"""The inference server's token endpoints, written once: POST /v1/generate (token ids in,
sampled ids and log-probs out; with `stream`, server-sent events: a `delta` per sampling step,
then the `result`) and POST /v1/score (log-probs of given ids, prefill only).

The server decodes the requests and encodes the results with these structs; the client
(`rlbus.clients.inference_client`) decodes the results with them; backends return them.
"""

from __future__ import annotations

from typing import Literal

import msgspec

FinishReason = Literal["stop", "length", "abort"]


class SamplingParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """How to sample one completion. Validated on construction and on decode; encoded without
    the fields left at their defaults."""

    temperature: float = 1.0
    """0 means greedy; log-probs are then those of the untempered distribution."""
    top_p: float = 1.0
    max_tokens: int | None = None
    """None: up to the model's context length."""
    stop: list[str] = []
    """Strings that end the completion: the text stops before them, the ids keep every token."""
    stop_token_ids: list[int] = []
    """Ids that end the completion (kept as its last id), besides the model's EOS."""
    ignore_eos: bool = False
    seed: int | None = None
    """Same seed: the same random draws, whatever else shares the batch."""
    top_logprobs: int = 0
    """Also return this many most likely tokens (and their log-probs) at each position, up to 20."""

    def __post_init__(self) -> None:
        # msgspec turns these into ValidationErrors (with the field path) when decoding JSON.
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")


class GenerateRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Body of POST /v1/generate (token in, token out)."""

    prompt_ids: list[int]
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    model: str | None = None
    return_text: bool = False
    stream: bool = False
    """Answer as server-sent events: `delta` events as tokens are sampled, then `result`
    (the GenerateResult, text included), or `error`."""


class TopLogprob(msgspec.Struct):
    token_id: int
    logprob: float


class Delta(msgspec.Struct, kw_only=True):
    """What one streaming step adds: tokens sampled since the last delta, and text now stable."""

    token_ids: list[int]
    logprobs: list[float]
    text: str = ""
    top_logprobs: list[list[TopLogprob]] | None = None


DELTA, RESULT, ERROR = "delta", "result", "error"
"""The event names of a streamed /v1/generate."""


class GenerateResult(msgspec.Struct, kw_only=True):
    """One finished completion: the body of a /v1/generate answer.

    `policy_version` is the weights version that sampled the first token. A weight reload
    during the request does not stop it: the rest is sampled by the new weights (after the
    cache is recomputed with them), and `max_policy_version` then exceeds `min_policy_version`.
    """

    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the completion, if any."""
    prompt_tokens: int
    policy_version: int
    min_policy_version: int
    max_policy_version: int
    text: str | None = None
    top_logprobs: list[list[TopLogprob]] | None = None


class ScoreRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Body of POST /v1/score: log-probs the model gives completion ids (prefill only)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    temperature: float = 1.0
    model: str | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for scoring, got {self.temperature}")


class ScoreResult(msgspec.Struct, kw_only=True):
    """The body of a /v1/score answer: one log-prob per completion id."""

    logprobs: list[float]
    policy_version: int
