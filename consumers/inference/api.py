"""What goes in and out of an inference backend, independent of HTTP and of the backend.

The built-in engine and the vLLM adapter both take these and return these, so the server,
the interception server and the tests see one contract.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol

import msgspec

FinishReason = Literal["stop", "length", "abort"]
BackendKind = Literal["hf", "vllm"]
"""hf: the built-in transformers engine; vllm: the vLLM adapter (GPU extra)."""
Arch = Literal["llama", "qwen3"]
Size = Literal["tiny", "small"]
TokenizerKind = Literal["bytes"]
"""Choices of `rlbus model init` (here, not in model_init, so the CLI does not import torch)."""


class RequestError(ValueError):
    """A request the backend refuses (bad ids, too long, bad sampling values): a client error."""

    code = "invalid_request"
    param: str | None = None


class ContextLengthError(RequestError):
    code = "context_length_exceeded"
    param = "prompt_ids"


class SamplingParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How to sample one completion. Validated on construction and on decode."""

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


class GenerateRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of POST /v1/generate (token in, token out)."""

    prompt_ids: list[int]
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    model: str | None = None
    return_text: bool = False


class TopLogprob(msgspec.Struct):
    token_id: int
    logprob: float


class GenerateResult(msgspec.Struct, kw_only=True):
    """One finished completion.

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


class Delta(msgspec.Struct, kw_only=True):
    """What one streaming step adds: tokens sampled since the last delta, and text now stable."""

    token_ids: list[int]
    logprobs: list[float]
    text: str = ""
    top_logprobs: list[list[TopLogprob]] | None = None


class ScoreRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of POST /v1/score: log-probs the model gives completion ids (prefill only)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    temperature: float = 1.0
    model: str | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for scoring, got {self.temperature}")


class ScoreResult(msgspec.Struct, kw_only=True):
    logprobs: list[float]
    policy_version: int


class WeightsRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of POST /v1/weights: load a safetensors file or directory at any fsspec URL."""

    uri: str
    version: int


class EngineStats(msgspec.Struct, kw_only=True):
    policy_version: int
    running: int
    waiting: int
    decode_steps: int
    mean_batch_size: float
    """Sequences per decode forward pass, averaged over all decode steps so far."""
    tokens_generated: int
    prompt_tokens: int
    requests_finished: int
    requests_scored: int
    weight_loads: int


class InferenceBackend(Protocol):
    """What the HTTP server needs from an engine (built-in transformers engine or vLLM)."""

    @property
    def policy_version(self) -> int: ...
    @property
    def max_context(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, text: bool = False
    ) -> GenerateResult: ...
    def stream(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[Delta | GenerateResult]:
        """Deltas as tokens are sampled, then the GenerateResult (with text) as the last item."""
        ...

    async def score(
        self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0
    ) -> ScoreResult: ...
    async def load_weights(self, uri: str, version: int) -> float:
        """Load a checkpoint, serve it as `version` from the next step; return seconds taken."""
        ...

    def stats(self) -> EngineStats: ...


def check_vocab(ids: list[int], vocab_size: int, param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        err = RequestError(f"{param}: token id {bad} is outside the vocabulary [0, {vocab_size})")
        err.param = param
        raise err


def check_prompt(prompt_ids: list[int], vocab_size: int, max_context: int) -> None:
    """Refuse prompt ids the model cannot take, before anything is queued."""
    if not prompt_ids:
        err = RequestError("prompt_ids is empty")
        err.param = "prompt_ids"
        raise err
    check_vocab(prompt_ids, vocab_size, "prompt_ids")
    if len(prompt_ids) >= max_context:
        raise ContextLengthError(
            f"prompt has {len(prompt_ids)} tokens; this model's context is {max_context} tokens "
            "and at least one must be left to generate"
        )
