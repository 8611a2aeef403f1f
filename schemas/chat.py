"""Chat messages as events carry them (OpenAI form), and reading their text."""

from __future__ import annotations

from typing import Any


def text_of(content: Any) -> str:
    """The text of OpenAI/Responses/Anthropic content: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))
