"""A client of the inference server: POST /v1/generate (env producers' train-mode backend),
POST /v1/score (teacher log-probs for distillation) and GET /health. The bodies are the structs
of `rlbus.clients.token_api`, the ones the server decodes and encodes.

aiohttp rather than httpx: an env producer makes one request per model call, and httpx's CPU
per request was the env producer's largest cost (`python bench/http_client.py` measures both).
"""

from __future__ import annotations

import urllib.request
from typing import TypeVar

import aiohttp
import msgspec

from rlbus.clients.token_api import (
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    ScoreRequest,
    ScoreResult,
)

T = TypeVar("T")


class InferenceError(RuntimeError):
    """The server could not be reached or answered an error; `status` 502 when unreachable."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


def healthy(url: str, timeout_s: float = 2) -> bool:
    """Whether the server behind a /v1 URL answers GET /health."""
    try:
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=timeout_s) as r:
            return r.status == 200
    except OSError:
        return False


class InferenceClient:
    def __init__(self, base_url: str, timeout_s: float = 600):
        """`base_url`: the server's /v1 URL."""
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        request = GenerateRequest(prompt_ids=prompt_ids, sampling=sampling)
        return await self._post("/generate", request, GenerateResult)

    async def score(
        self, prompt_ids: list[int], completion_ids: list[int], temperature: float
    ) -> list[float]:
        """Log-probs of `completion_ids` after `prompt_ids`, one per completion token."""
        try:
            request = ScoreRequest(
                prompt_ids=prompt_ids, completion_ids=completion_ids, temperature=temperature
            )
        except ValueError as exc:  # what the server would answer with 400
            raise InferenceError(f"{self.base_url}/score: {exc}", 400) from None
        scored = (await self._post("/score", request, ScoreResult)).logprobs
        if len(scored) != len(completion_ids):
            raise InferenceError(
                f"{self.base_url}/score scored {len(scored)} of {len(completion_ids)} tokens"
            )
        return scored

    async def _post(self, path: str, body: msgspec.Struct, into: type[T]) -> T:
        if self._session is None:
            # Made on first use, inside the event loop that will use it (aiohttp binds to it).
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=0),
            )  # concurrency is bounded by the callers
        url = self.base_url + path
        try:
            async with self._session.post(
                url, data=msgspec.json.encode(body), headers={"content-type": "application/json"}
            ) as response:
                content = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise InferenceError(f"inference {url} unreachable: {exc!r}") from exc
        if response.status != 200:
            raise InferenceError(
                f"inference {url} answered {response.status}: "
                f"{content[:500].decode(errors='replace')}",
                response.status,
            )
        return msgspec.json.decode(content, type=into)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
