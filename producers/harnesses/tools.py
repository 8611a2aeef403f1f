"""Tools for the tools harness: a task set's @tool methods (schemas from their signatures) and
the tools of MCP servers (stdio), all called through one interface. Each rollout starts its own
MCP servers, so no server state leaks from one rollout into another."""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pydantic

from rlbus.config.env import McpServerConfig
from rlbus.environment.rules import Rule
from rlbus.producers.harnesses.base import Rollout

Call = Callable[[dict[str, Any], Rollout], Awaitable[str]]


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _strip_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title"}
    return schema


def python_tool(rule: Rule) -> tuple[dict[str, Any], Call]:
    """The OpenAI function schema of a @tool method, and a caller validating the model's
    arguments."""
    fields = {
        p.name: (
            p.annotation if p.annotation is not inspect.Parameter.empty else Any,
            ... if p.default is inspect.Parameter.empty else p.default,
        )
        for p in rule.own
    }
    # fields built at runtime: pydantic's overloads expect them spelled out
    model = pydantic.create_model(f"{rule.name}_arguments", **fields)  # type: ignore[call-overload]
    doc = inspect.getdoc(rule.fn) or ""
    schema = {
        "type": "function",
        "function": {
            "name": rule.name,
            "description": doc.split("\n\n")[0],
            "parameters": _strip_titles(model.model_json_schema()),
        },
    }

    async def call(arguments: dict[str, Any], rollout: Rollout) -> str:
        parsed = model.model_validate(arguments)
        return _as_text(await rule(rollout.available(), **dict(parsed)))

    return schema, call


@contextlib.asynccontextmanager
async def mcp_tools(config: McpServerConfig) -> AsyncIterator[list[tuple[dict[str, Any], Call]]]:
    """Start one MCP server (stdio) for the block; its tools as schemas and callers."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=config.command[0], args=config.command[1:], env=config.env or None
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()

        def caller(name: str) -> Call:
            async def call(arguments: dict[str, Any], rollout: Rollout) -> str:
                result = await session.call_tool(name, arguments)
                text = "".join(getattr(block, "text", "") for block in result.content)
                if result.is_error:
                    raise RuntimeError(text or f"MCP tool {name} failed")
                return text

            return call

        yield [
            (
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description or "",
                        "parameters": t.input_schema,
                    },
                },
                caller(t.name),
            )
            for t in listed.tools
        ]


class ToolBox:
    """The tools offered to the model in one rollout."""

    def __init__(self, tools: list[tuple[dict[str, Any], Call]]):
        self.schemas = [schema for schema, _ in tools]
        self._calls = {schema["function"]["name"]: call for schema, call in tools}

    async def run(self, tool_call: dict[str, Any], rollout: Rollout) -> dict[str, Any]:
        """The tool message answering `tool_call`; failures are reported to the model, not
        raised."""
        function = tool_call.get("function", {})
        name = function.get("name", "")
        call = self._calls.get(name)
        try:
            if call is None:
                raise LookupError(f"no tool named {name!r}; tools: {sorted(self._calls)}")
            arguments = json.loads(function.get("arguments") or "{}")
            content = await call(arguments, rollout)
        except Exception as exc:
            content = f"error: {type(exc).__name__}: {exc}"
        return {"role": "tool", "tool_call_id": tool_call.get("id", ""), "content": content}


@contextlib.asynccontextmanager
async def open_toolbox(rules: list[Rule], servers: list[McpServerConfig]) -> AsyncIterator[ToolBox]:
    async with contextlib.AsyncExitStack() as stack:
        tools = [python_tool(rule) for rule in rules]
        for server in servers:
            tools += await stack.enter_async_context(mcp_tools(server))
        yield ToolBox(tools)
