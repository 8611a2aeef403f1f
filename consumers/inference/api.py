"""What goes in and out of an inference backend, independent of HTTP and of the backend.

The built-in engine and the vLLM adapter both take these and return these, so the server and
the tests see one contract. The structs of the token endpoints (SamplingParams, GenerateResult,
ScoreResult, ...) are defined with their client in `rlbus.clients.token_api` and named here too,
as part of this contract.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol

import msgspec

from rlbus.clients.token_api import Delta as Delta
from rlbus.clients.token_api import FinishReason as FinishReason  # the backends' vocabulary too
from rlbus.clients.token_api import GenerateResult, SamplingParams, ScoreResult
from rlbus.clients.token_api import TopLogprob as TopLogprob

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

    @property
    def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters `score` takes by name (the built-in engine's add_adapter)."""
        ...

    async def score(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        temperature: float = 1.0,
        adapter: str | None = None,
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
