"""Chat messages in OpenAI form, the one shape everything inside the interception server uses.

Clients echo earlier turns back in their own way (content as a string or as parts, arguments
re-serialised, null vs empty content), so turns are matched by a canonical key rather than by
equality.
"""

from __future__ import annotations

import json
from typing import Any

from rlbus.schemas.chat import text_of

Message = dict[str, Any]


def _arguments(raw: Any) -> str:
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return str(raw)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def canonical(message: Message) -> str:
    """A key equal for two renderings of the same turn."""
    calls = [
        (
            c.get("function", {}).get("name", ""),
            _arguments(c.get("function", {}).get("arguments", "{}")),
        )
        for c in message.get("tool_calls") or []
    ]
    key = [
        message.get("role", ""),
        text_of(message.get("content")),
        calls,
        message.get("tool_call_id") or "",
    ]
    return json.dumps(key, separators=(",", ":"), ensure_ascii=False)


def assistant_message(
    content: str | None, tool_calls: list[dict[str, Any]] | None = None
) -> Message:
    message: Message = {
        "role": "assistant",
        "content": content if content or not tool_calls else None,
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message
