"""A Responses API conversation is one branch of the trace however the client continues it: by
`previous_response_id` (the server keeps the conversation) or by sending the whole input again
(output items echoed back, text and function calls of one response as one turn). Real openai
client, the interception server, the scripted upstream on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from support import ScriptedModel, ScriptedServer

from rlbus.environment import ModelConfig
from rlbus.producers.interception import EvalBackend, InterceptionServer
from rlbus.producers.interception.server import RolloutSession

CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
TOOLS = [
    {
        "type": "function",
        "name": "add",
        "description": "Add.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    }
]


def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Says something and calls `add` while offered tools and no result is in; otherwise counts
    the messages it was shown."""
    if tools and not any(m["role"] == "tool" for m in messages):
        return {"content": "let me add", "tool_calls": [CALL]}
    return {"content": f"seen {len(messages)} messages"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedModel(chat=script)) as server:
        yield server


@pytest.fixture
async def server(upstream: ScriptedServer) -> AsyncIterator[InterceptionServer]:
    upstream.model.calls.clear()
    backend = EvalBackend(ModelConfig(name="scripted", base_url=f"{upstream.url}/v1"))
    async with InterceptionServer(backend) as s:
        yield s


def shape(session: RolloutSession) -> list[tuple[str, str, str | None]]:
    """(branch, role, parent's role) of each node the rollout's trace stores."""
    nodes, _ = session.trace.events("g")
    by_id = {n.node_id: n for n in nodes}
    return [(n.branch_id, n.role, by_id[n.parent_id].role if n.parent_id else None) for n in nodes]


async def test_previous_response_id_extends_the_branch(
    server: InterceptionServer, upstream: ScriptedServer
) -> None:
    with server.session("r-previous") as session:
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key="k", max_retries=0)
        first = await client.responses.create(model="m", instructions="be brief", input="hi")
        second = await client.responses.create(
            model="m",
            instructions="be brief",
            previous_response_id=first.id,
            input=[{"role": "user", "content": "again"}],
        )
        # Streamed, and with no instructions: OpenAI does not carry instructions over.
        third = [
            e
            async for e in await client.responses.create(
                model="m", previous_response_id=second.id, input="and again", stream=True
            )
        ]
        assert third[-1].type == "response.completed"
        shown = [[m["role"] for m in call["messages"]] for call in upstream.model.calls]
        assert shown == [
            ["system", "user"],
            ["system", "user", "assistant", "user"],
            ["user", "assistant", "user", "assistant", "user"],
        ]
        assert second.output_text == "seen 4 messages"
        assert shape(session)[:6] == [
            ("main", "system", None),
            ("main", "user", "system"),
            ("main", "assistant", "user"),
            ("main", "user", "assistant"),
            ("main", "assistant", "user"),
            ("b1", "user", None),  # without the system message the context differs
        ]
        with pytest.raises(openai.BadRequestError, match="previous_response_id 'resp_nope'"):
            await client.responses.create(model="m", previous_response_id="resp_nope", input="x")


async def test_the_whole_input_again_with_text_and_calls_in_one_response(
    server: InterceptionServer, upstream: ScriptedServer
) -> None:
    with server.session("r-again") as session:
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key="k", max_retries=0)
        first = await client.responses.create(model="m", input="add", tools=TOOLS)
        assert [item.type for item in first.output] == ["message", "function_call"]
        follow_up = [
            {"role": "user", "content": "add"},
            *(item.model_dump(exclude_none=True) for item in first.output),
            {"type": "function_call_output", "call_id": "call_1", "output": "1"},
        ]
        second = await client.responses.create(model="m", input=follow_up, tools=TOOLS)
        assert second.output_text == "seen 3 messages"
    assert shape(session) == [
        ("main", "user", None),
        ("main", "assistant", "user"),
        ("main", "tool", "assistant"),
        ("main", "assistant", "tool"),
    ]
