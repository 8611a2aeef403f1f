"""Harnesses without the bus: the tools loop (task-set tools and an MCP server's), tool mistakes
reported to the model, the model-driven user simulator, and the whole-rollout time limit; all
against scripted models on 127.0.0.1."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support import ScriptedModel, ScriptedServer

from rlbus.environment import Scorer, load_environment
from rlbus.producers.interception import EvalBackend, InterceptionServer
from rlbus.producers.rollouts import RolloutOutput, RolloutRunner

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{name}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


async def run_one(
    spec: str, model: ScriptedModel, overrides: dict[str, Any] | None = None
) -> RolloutOutput:
    with ScriptedServer(model) as upstream:
        env = load_environment(
            spec,
            {"model": {"name": "scripted", "base_url": f"{upstream.url}/v1"}, **(overrides or {})},
        )
        async with InterceptionServer(EvalBackend(env.config.model), env.config.sampling) as server:
            return await RolloutRunner(env, server).run(next(iter(env.tasks("r"))), "group", 0, 1)


async def test_tools_harness_runs_task_set_tools_and_scores() -> None:
    def script(messages: list[dict], tools: list[dict] | None) -> dict[str, Any]:
        assert tools and tools[0]["function"]["name"] == "calculate"
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if not results:
            expression = messages[-1]["content"].removeprefix("Calculate ").rstrip(".")
            return call("calculate", {"expression": expression})
        return {"content": results[-1]}

    out = await run_one(str(EXAMPLES / "calculator"), ScriptedModel(chat=script))
    assert out.rollout.status == "ok", out.rollout.error
    assert [m["role"] for m in out.rollout.completion] == ["assistant", "tool", "assistant"]
    assert out.rollout.num_turns == 2 and out.rollout.info["state"] == {"tool_calls": 1}
    # what the model was offered, once, in OpenAI form (a chat-format export's `tools`)
    assert [t["function"]["name"] for t in out.rollout.tools] == ["calculate"]
    env = load_environment(str(EXAMPLES / "calculator"))
    (scored,) = await Scorer(env).score([out.rollout])
    assert (scored.rewards, scored.metrics) == ({"correct": 1.0}, {"tool_calls": 1.0})


async def test_tool_mistakes_are_reported_to_the_model() -> None:
    def script(messages: list[dict], tools: list[dict] | None) -> dict[str, Any]:
        turn = sum(m["role"] == "assistant" for m in messages)
        return [
            call("nope", {}),
            call("calculate", {"expr": "1"}),
            call("calculate", {"expression": "import os"}),
            {"content": "give up"},
        ][turn]

    out = await run_one(
        str(EXAMPLES / "calculator"), ScriptedModel(chat=script), {"harness": {"max_turns": 4}}
    )
    errors = [m["content"] for m in out.rollout.completion if m["role"] == "tool"]
    assert errors[0].startswith("error: LookupError: no tool named 'nope'")
    assert errors[1].startswith("error: ValidationError") and "expression" in errors[1]
    assert errors[2].startswith("error: SyntaxError")
    assert out.rollout.status == "ok" and out.rollout.completion[-1]["content"] == "give up"


@pytest.mark.slow
async def test_mcp_server_tools(tmp_path: Path) -> None:
    (tmp_path / "server.py").write_text(
        textwrap.dedent('''
        from mcp.server.mcpserver import MCPServer
        server = MCPServer("words")
        @server.tool()
        def shout(text: str) -> str:
            """Upper-case the text."""
            return text.upper()
        server.run()
    ''')
    )
    (tmp_path / "env.py").write_text(
        textwrap.dedent("""
        from rlbus.environment import TaskSet, reward
        class Shouting(TaskSet):
            def rows(self):
                return [{"prompt": "shout hello", "answer": "HELLO"}]
            @reward
            def loud(self, text, answer):
                return float(text == answer)
    """)
    )

    def script(messages: list[dict], tools: list[dict] | None) -> dict[str, Any]:
        assert [t["function"]["name"] for t in tools or []] == ["shout"]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        return {"content": results[-1]} if results else call("shout", {"text": "hello"})

    out = await run_one(
        str(tmp_path / "env.py"),
        ScriptedModel(chat=script),
        {
            "harness": {
                "kind": "tools",
                "mcp_servers": [{"command": [sys.executable, str(tmp_path / "server.py")]}],
            }
        },
    )
    assert out.rollout.status == "ok", out.rollout.error
    assert out.rollout.completion[-1]["content"] == "HELLO"


async def test_model_driven_user_simulator() -> None:
    def user_script(messages: list[dict], tools: list[dict] | None) -> dict[str, Any]:
        # The simulator sees the conversation from the user's side: the policy's turns as "user".
        assert messages[0]["role"] == "system" and messages[-1]["role"] == "user"
        return {"content": "DONE" if len(messages) > 3 else "Try once more."}

    with ScriptedServer(ScriptedModel(chat=user_script)) as user_model:
        out = await run_one(
            str(EXAMPLES / "reverse_text"),
            ScriptedModel(),
            {"harness": {"user_model": {"name": "user-sim", "base_url": f"{user_model.url}/v1"}}},
        )
    roles = [m["role"] for m in out.rollout.completion]
    assert (
        roles == ["assistant", "user", "assistant"]
        and out.rollout.completion[1]["content"] == "Try once more."
    )


async def test_rollout_over_its_time_limit_is_errored() -> None:
    out = await run_one(
        str(EXAMPLES / "reverse_text"), ScriptedModel(delay_s=5), {"harness": {"timeout_s": 0.5}}
    )
    assert (out.rollout.status, out.rollout.error_kind) == ("error", "timeout")
    assert "harness.timeout_s = 0.5s" in out.rollout.error
