"""Stored messages (OpenAI form, kept as JSON) made ready to show: text, tool calls with their
arguments, tool results."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """Pretty-printed when they are JSON."""


@dataclass(frozen=True)
class MessageView:
    role: str
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""


def shown_text(content: Any) -> str:
    """A message's content as text: a string, or the text of its parts (others named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part.get("text", "")
            if part.get("type") in ("text", "input_text", "output_text")
            else f"[{part.get('type', 'part')}]"
            for part in content
            if isinstance(part, dict)
        )
    return json.dumps(content, ensure_ascii=False)


def _pretty(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, indent=2, ensure_ascii=False)


def message_view(raw: dict[str, Any]) -> MessageView:
    calls = [
        ToolCall(
            str(c.get("id", "")),
            str((c.get("function") or {}).get("name", c.get("name", ""))),
            _pretty((c.get("function") or {}).get("arguments", c.get("arguments", ""))),
        )
        for c in raw.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return MessageView(
        role=str(raw.get("role", "")),
        text=shown_text(raw.get("content")),
        tool_calls=calls,
        tool_call_id=str(raw.get("tool_call_id", "") or ""),
        name=str(raw.get("name", "") or ""),
    )


def message_views(stored: str | list | dict | None, role: str = "user") -> list[MessageView]:
    """A stored prompt or completion: a JSON list of messages, or a JSON string (one message of
    `role`)."""
    value: Any = stored
    if isinstance(stored, str):
        try:
            value = json.loads(stored)
        except ValueError:
            value = stored
    if value in (None, "", []):
        return []
    if isinstance(value, str):
        return [MessageView(role, value)]
    if isinstance(value, dict):
        value = [value]
    return [message_view(m) for m in value if isinstance(m, dict)]


def message_summary(raw: dict[str, Any], limit: int) -> str:
    shown = message_view(raw)
    text = " ".join(shown.text.split()) or ", ".join(f"{c.name}(…)" for c in shown.tool_calls)
    return text if len(text) <= limit else text[: limit - 1] + "…"
