"""The OpenAI Agents SDK as an rlbus command harness (`harness.kind = "openai-agents"`): one
Agent over the task's messages, speaking to the rollout's URL (OPENAI_BASE_URL), its final
output printed. Runs as a plain program in the rollout's runtime; it imports nothing of rlbus.

RLBUS_AGENT_API: "responses" or "chat"; RLBUS_AGENT_MAX_TURNS: the run's turn limit."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner
from openai import AsyncOpenAI


def client() -> AsyncOpenAI:
    """The OpenAI client, with a Responses answer cut at the token limit taken as the answer:
    the SDK raises on status "incomplete", while the same cut in chat mode (finish_reason
    "length") is an answer to it, and the rollout's trace holds the truncated tokens either
    way."""
    openai = AsyncOpenAI()
    create = openai.responses.create

    async def create_accepting_length(*args: Any, **kwargs: Any) -> Any:
        response = await create(*args, **kwargs)
        details = getattr(response, "incomplete_details", None)
        status = getattr(response, "status", None)
        if status == "incomplete" and getattr(details, "reason", "") == "max_output_tokens":
            response.status = "completed"
        return response

    openai.responses.create = create_accepting_length
    return openai


async def main() -> None:
    with open(os.environ["RLBUS_TASK_FILE"]) as f:
        messages = json.load(f)["messages"]
    name = os.environ.get("RLBUS_MODEL", "default")
    kind = os.environ.get("RLBUS_AGENT_API", "responses")
    model_class = OpenAIResponsesModel if kind == "responses" else OpenAIChatCompletionsModel
    instructions = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    agent = Agent(
        name="rlbus",
        instructions=instructions or None,
        model=model_class(model=name, openai_client=client()),
    )
    conversation = [
        {"role": m["role"], "content": m["content"]}
        for m in messages
        if m["role"] in ("user", "assistant") and isinstance(m.get("content"), str)
    ]
    turns = int(os.environ.get("RLBUS_AGENT_MAX_TURNS", "10"))
    # plain message dicts: the SDK's TypedDicts describe the same JSON
    result = await Runner.run(agent, conversation, max_turns=turns)  # type: ignore[arg-type]
    print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())
