"""A client of the inference server: POST /v1/generate (env producers' train-mode backend),
whole or streamed, POST /v1/score (teacher log-probs for distillation) and GET /health. The
bodies are the structs of `rlbus.clients.token_api`, the ones the server decodes and encodes.

aiohttp rather than httpx: an env producer makes one request per model call, and httpx's CPU
per request was the env producer's largest cost (`python bench/http_client.py` measures both).
"""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

import aiohttp
import msgspec
from opentelemetry import propagate

from rlbus.clients.token_api import (
    DELTA,
    ERROR,
    RESULT,
    Delta,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    ScoreRequest,
    ScoreResult,
)

T = TypeVar("T")


KEEPALIVE_S = 4.0
"""How long an idle connection is kept for the next request: under the 5 s after which uvicorn
(the inference server's) closes one."""


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

    async def generate_stream(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> AsyncGenerator[Delta | GenerateResult]:
        """Deltas as the server samples them, then the GenerateResult as the last item."""
        request = GenerateRequest(prompt_ids=prompt_ids, sampling=sampling, stream=True)
        url = self.base_url + "/generate"
        async with self._request(url, request) as response:
            if response.status != 200:
                raise await self._refused(url, response)
            event = ""
            try:
                async for line in response.content:
                    if line.startswith(b"event:"):
                        event = line[6:].strip().decode()
                    elif line.startswith(b"data:"):
                        data = line[5:].strip()
                        if event == DELTA:
                            yield msgspec.json.decode(data, type=Delta)
                        elif event == RESULT:
                            yield msgspec.json.decode(data, type=GenerateResult)
                            return
                        elif event == ERROR:
                            raise InferenceError(f"inference {url}: {data.decode()}", 400)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise InferenceError(f"inference {url} broke off its stream: {exc!r}") from exc
        raise InferenceError(f"inference {url} ended its stream without a result")

    async def score(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        temperature: float,
        model: str | None = None,
    ) -> list[float]:
        """Log-probs of `completion_ids` after `prompt_ids`, one per completion token, by the
        server's model or the adapter `model` names."""
        try:
            request = ScoreRequest(
                prompt_ids=prompt_ids,
                completion_ids=completion_ids,
                temperature=temperature,
                model=model,
            )
        except ValueError as exc:  # what the server would answer with 400
            raise InferenceError(f"{self.base_url}/score: {exc}", 400) from None
        scored = (await self._post("/score", request, ScoreResult)).logprobs
        if len(scored) != len(completion_ids):
            raise InferenceError(
                f"{self.base_url}/score scored {len(scored)} of {len(completion_ids)} tokens"
            )
        return scored

    @contextlib.asynccontextmanager
    async def _request(
        self, url: str, body: msgspec.Struct
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        try:
            headers = {"content-type": "application/json"}
            propagate.inject(headers)  # W3C trace context: inference continues the call's trace
            response = await self._sent(url, msgspec.json.encode(body), headers)
            async with response:
                yield response
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise InferenceError(f"inference {url} unreachable: {exc!r}") from exc

    async def _sent(self, url: str, data: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """The response to a POST, sent once more when the server closed the connection before
        answering. A server closes a kept-alive connection that idled past its limit, and a
        request sent on it as it closes was never read (tests/inference/test_inference_client.py):
        sent again, it goes on a new connection. A server that had begun to answer is not
        asked again."""
        session = self._opened()
        try:
            return await session.post(url, data=data, headers=headers)
        except aiohttp.ServerDisconnectedError:
            return await session.post(url, data=data, headers=headers)

    def _opened(self) -> aiohttp.ClientSession:
        """The session, made on first use inside the event loop that uses it (aiohttp binds to
        it)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                # limit=0: concurrency is bounded by the callers. An idle connection is given up
                # before uvicorn's 5 s would close it from the other end.
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
            )
        return self._session

    @staticmethod
    async def _refused(url: str, response: aiohttp.ClientResponse) -> InferenceError:
        content = await response.read()
        return InferenceError(
            f"inference {url} answered {response.status}: {content[:500].decode(errors='replace')}",
            response.status,
        )

    async def _post(self, path: str, body: msgspec.Struct, into: type[T]) -> T:
        url = self.base_url + path
        async with self._request(url, body) as response:
            if response.status != 200:
                raise await self._refused(url, response)
            content = await response.read()
        return msgspec.json.decode(content, type=into)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
