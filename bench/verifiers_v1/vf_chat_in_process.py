"""A verifiers 0.4 (V1) harness that runs its chat turn in-process (the contract V1 states in
`Harness.launch`: every model call goes through the interception endpoint; no program is
launched), for `bench/vs_verifiers.py --v1`: V1's eval without a process per rollout."""

from __future__ import annotations

import openai
import verifiers.v1 as vf
from verifiers.v1.runtimes import ProgramResult

__all__ = ["ChatInProcessHarness"]


class ChatInProcessConfig(vf.HarnessConfig):
    pass


class ChatInProcessHarness(vf.Harness[ChatInProcessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    def __init__(self, config: ChatInProcessConfig) -> None:
        super().__init__(config)
        self.clients: dict[tuple[str, str], openai.AsyncOpenAI] = {}

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
        client = self.clients.get((endpoint, secret))
        if client is None:
            client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
            self.clients[(endpoint, secret)] = client
        reply = await client.chat.completions.create(model=ctx.model, messages=messages)
        return ProgramResult(0, reply.choices[0].message.content or "", "")
