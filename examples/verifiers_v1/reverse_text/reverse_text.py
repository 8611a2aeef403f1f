"""reverse_text as a verifiers V1 task set: reverse a short word, full credit for the exact
reversal, half weight for partial credit by longest common subsequence. The words are generated
as rlbus's built-in reverse_text generates them (same seed, same words), so the two can be
compared task by task. It bundles its harness (one chat turn, every call through the endpoint
V1 gives it), so it runs without a program per rollout; `harness = {id = "null"}` in the
environment's args picks V1's own instead.

    rlbus env install examples/verifiers_v1/reverse_text
    rlbus eval verifiers:reverse_text -n 20"""

from __future__ import annotations

import random
from collections.abc import Iterator

import openai
import verifiers.v1 as vf
from verifiers.v1.runtimes import ProgramResult

__all__ = ["ReverseTextTaskset", "OneTurnHarness"]

LETTERS = "abcdefghijklmnopqrstuvwxyz"
SYSTEM_PROMPT = "Reverse the text you are given. Answer with the reversed text only."


def lcs_ratio(a: str, b: str) -> float:
    """2 * |LCS(a, b)| / (|a| + |b|)."""
    if not a and not b:
        return 1.0
    row = [0] * (len(b) + 1)
    for ch in a:
        diagonal = 0
        for j, other in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if ch == other else max(row[j], row[j - 1])
    return 2 * row[-1] / (len(a) + len(b))


class ReverseTextData(vf.TaskData):
    answer: str = ""


class ReverseTextTask(vf.Task[ReverseTextData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.reward(weight=0.5)
    async def partial(self, trace: vf.Trace) -> float:
        return lcs_ratio(trace.last_reply.strip(), self.data.answer)


class ReverseTextConfig(vf.TasksetConfig):
    n: int = 10_000
    seed: int = 0


class ReverseTextTaskset(vf.Taskset[ReverseTextTask, ReverseTextConfig]):
    def load(self) -> Iterator[ReverseTextTask]:
        rng = random.Random(self.config.seed)
        for i in range(self.config.n):
            word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(5, 8)))
            yield ReverseTextTask(
                ReverseTextData(
                    name=f"reverse_text#{i}",
                    prompt=f"Reverse the text: {word}",
                    system_prompt=SYSTEM_PROMPT,
                    answer=word[::-1],
                ),
                self.config.task,
            )


class OneTurnConfig(vf.HarnessConfig):
    pass


class OneTurnHarness(vf.Harness[OneTurnConfig]):
    """One chat turn in-process (V1's `Harness.launch` contract: every model call through the
    interception endpoint; no program launched)."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    def __init__(self, config: OneTurnConfig) -> None:
        super().__init__(config)
        self.clients: dict[str, openai.AsyncOpenAI] = {}

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        system_prompt, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [dict(m) for m in prompt or []]
        # One client per endpoint; V1 gives every rollout a secret of its own, sent with its
        # request (a client per secret would load TLS certificates and keep a pool per rollout).
        client = self.clients.get(endpoint)
        if client is None:
            client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
            self.clients[endpoint] = client
        reply = await client.with_options(api_key=secret).chat.completions.create(
            model=ctx.model, messages=messages
        )
        return ProgramResult(0, reply.choices[0].message.content or "", "")
