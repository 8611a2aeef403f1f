"""Teacher log-probs over HTTP: the inference server's POST /v1/score (prefill only)."""

from __future__ import annotations

import httpx
import msgspec


class _Scored(msgspec.Struct):
    logprobs: list[float]


class HttpScorer:
    def __init__(self, base_url: str, timeout_s: float = 600):
        self.url = base_url.rstrip("/") + "/score"
        self.http = httpx.AsyncClient(timeout=timeout_s)

    async def score(self, prompt_ids: list[int], completion_ids: list[int], temperature: float) -> list[float]:
        body = {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "temperature": temperature}
        try:
            response = await self.http.post(self.url, content=msgspec.json.encode(body),
                                            headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            raise RuntimeError(f"teacher {self.url} unreachable: {exc!r}") from exc
        if response.status_code != 200:
            raise RuntimeError(f"teacher {self.url} answered {response.status_code}: {response.text[:300]}")
        scored = msgspec.json.decode(response.content, type=_Scored).logprobs
        if len(scored) != len(completion_ids):
            raise RuntimeError(f"teacher {self.url} scored {len(scored)} of {len(completion_ids)} tokens")
        return scored

    async def close(self) -> None:
        await self.http.aclose()
