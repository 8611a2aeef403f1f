"""Messages <-> token ids, and multi-turn extension from recorded ids.

Two implementations of one small interface:

- `PackageRenderer` wraps Prime Intellect's `renderers` package (hand-written, parity-tested
  renderers for Qwen3, Llama 3, GLM, DeepSeek, Kimi, gpt-oss...). It is picked for models the
  package knows by name, or when a renderer name is given.
- `TemplateRenderer` uses the tokenizer's own Jinja chat template (our tiny byte-level models,
  any fine-tune with a custom template). Tool calls are parsed in the format our template
  writes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

`extend(prev_prompt_ids, prev_completion_ids, new_messages)` appends only what the new
messages add (and the generation prompt) to the recorded ids: sampled tokens are never
decoded and re-tokenized, which would change them and break the trainer's log-probs.
Decoded, extended ids equal the template's rendering of the conversation except where that
rendering is not what was sampled: an assistant turn is its sampled ids (a tool call as the
text the model wrote, whatever the template would make of the parsed call), a completion cut
by max_tokens or a stop string gets the template's turn close appended, and a completion
ends at its stop token, before anything the template writes after it (ChatML's newline).

System prompts: an environment's system prompt reaches here as the conversation's first
message (TaskSet.messages), and templates such as SmolLM2's ChatML write their own default
system prompt only when there is no system message, so the env's replaces it. A task with no
system prompt keeps whatever the template writes: that is the prompt the model was tuned on,
and leaving it out would be a choice the renderer makes for the environment.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Any, Protocol, cast

from transformers import PreTrainedTokenizerBase

from rlbus.clients.openai_wire import tool_call
from rlbus.schemas import Messages
from rlbus.schemas.chat import text_of

if TYPE_CHECKING:
    import renderers

Tools = list[dict[str, Any]] | None

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# The probe conversation that measures what the template puts around an assistant turn.
_PROBE_USER = {"role": "user", "content": "A"}
_PROBE_ANSWER = "B"


class RendererError(ValueError):
    """The renderer cannot do what was asked without re-tokenizing history; the message says why."""


class Renderer(Protocol):
    @property
    def stop_token_ids(self) -> list[int]: ...

    def render(self, messages: Messages, *, tools: Tools = None) -> list[int]:
        """Prompt ids for `messages`, ending with the assistant generation prompt."""
        ...

    def parse(
        self, completion_ids: list[int], *, tools: Tools = None, prompt_ids: list[int] | None = None
    ) -> dict[str, Any]:
        """The assistant message sampled as these ids (content, tool_calls, reasoning_content)."""
        ...

    def extend(
        self,
        prev_prompt_ids: list[int],
        prev_completion_ids: list[int],
        new_messages: Messages,
        *,
        tools: Tools = None,
    ) -> list[int]:
        """prev_prompt_ids + prev_completion_ids + what new_messages add + generation prompt."""
        ...


def _call_id(completion_ids: list[int], index: int) -> str:
    # Derived from the sampled ids, so replaying a rollout names its calls the same way.
    digest = hashlib.blake2b(repr((completion_ids, index)).encode(), digest_size=8).hexdigest()
    return f"call_{digest}"


def _tool_call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return tool_call(call_id, name, args)


def _common_suffix_prefix(ids: list[int], close: list[int]) -> int:
    """Longest k such that ids ends with close[:k]."""
    for k in range(min(len(close), len(ids)), 0, -1):
        if ids[-k:] == close[:k]:
            return k
    return 0


class TemplateRenderer:
    """The tokenizer's own chat template, for models `renderers` does not know."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if not tokenizer.chat_template:
            raise RendererError(
                f"tokenizer {tokenizer.name_or_path!r} has no chat template; "
                "name a `renderers` renderer instead"
            )
        self._tok = tokenizer
        eos = tokenizer.eos_token_id
        self._stop: list[int] = [eos] if isinstance(eos, int) else []
        end = self._end_of_turn()
        if end is not None and end not in self._stop:
            self._stop.append(end)

    @property
    def stop_token_ids(self) -> list[int]:
        return self._stop

    def _end_of_turn(self) -> int | None:
        """The special token the template closes an assistant turn with (ChatML's <|im_end|>),
        which need not be the tokenizer's EOS (a base model's is often <|endoftext|>)."""
        try:
            _, close = self._turn_close(None)
        except RendererError:
            return None
        special = set(self._tok.all_special_ids) | set(self._tok.added_tokens_decoder)
        return close[0] if close and close[0] in special else None

    def _ids(self, messages: Messages, tools: Tools, generation_prompt: bool) -> list[int]:
        # Render to text, then encode without extra specials: exactly what apply_chat_template
        # does when tokenizing, but stable across transformers' return-type changes.
        text = self._tok.apply_chat_template(
            [{**m, "content": text_of(m.get("content"))} for m in messages],
            tools=None if tools is None else [*tools],
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )
        assert isinstance(text, str)  # tokenize=False renders text
        return self._tok.encode(text, add_special_tokens=False)

    def render(self, messages: Messages, *, tools: Tools = None) -> list[int]:
        return self._ids(messages, tools, generation_prompt=True)

    def parse(
        self, completion_ids: list[int], *, tools: Tools = None, prompt_ids: list[int] | None = None
    ) -> dict[str, Any]:
        ids = list(completion_ids)
        while ids and ids[-1] in self._stop:
            ids.pop()
        text = self._tok.decode(ids, skip_special_tokens=True)
        assert isinstance(text, str)  # one sequence decodes to one string
        calls: list[dict[str, Any]] = []

        def take(match: re.Match[str]) -> str:
            try:
                body = json.loads(match.group(1))
            except json.JSONDecodeError:
                return match.group(0)  # malformed calls stay visible as text
            if not isinstance(body, dict) or not isinstance(body.get("name"), str):
                return match.group(0)
            calls.append(
                _tool_call(
                    body["name"], body.get("arguments", {}), _call_id(completion_ids, len(calls))
                )
            )
            return ""

        content = _TOOL_CALL.sub(take, text)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content if content or not calls else None,
        }
        if calls:
            message["tool_calls"] = calls
        return message

    def _turn_close(self, tools: Tools) -> tuple[list[int], list[int]]:
        """(ids of a full probe conversation, ids the template puts after an assistant's text)."""
        asked = self._ids([_PROBE_USER], tools, generation_prompt=True)
        full = self._ids(
            [_PROBE_USER, {"role": "assistant", "content": _PROBE_ANSWER}],
            tools,
            generation_prompt=False,
        )
        body = self._tok.encode(_PROBE_ANSWER, add_special_tokens=False)
        tail = full[len(asked) :]
        if full[: len(asked)] != asked or tail[: len(body)] != body:
            raise RendererError(
                "the chat template does not render an assistant turn as generation prompt + "
                "text; cannot extend"
            )
        return full, tail[len(body) :]

    def extend(
        self,
        prev_prompt_ids: list[int],
        prev_completion_ids: list[int],
        new_messages: Messages,
        *,
        tools: Tools = None,
    ) -> list[int]:
        if not new_messages:
            raise RendererError("extend needs at least one new message")
        probe, close = self._turn_close(tools)
        ids = list(prev_prompt_ids) + list(prev_completion_ids)
        # A completion that stopped on EOS already holds the start of the turn close; one cut by
        # max_tokens or a stop string holds none of it.
        ids += close[_common_suffix_prefix(ids, close) :]
        extended = self._ids(
            [_PROBE_USER, {"role": "assistant", "content": _PROBE_ANSWER}, *new_messages],
            tools,
            generation_prompt=True,
        )
        if extended[: len(probe)] != probe:
            raise RendererError(
                "the chat template re-renders earlier turns when messages are added; cannot extend"
            )
        return ids + extended[len(probe) :]


def _messages(messages: Messages) -> list[renderers.Message]:
    # Chat messages are the OpenAI wire's JSON objects, which the package's TypedDict describes.
    return cast("list[renderers.Message]", messages)


def _tools(tools: Tools) -> list[renderers.ToolSpec] | None:
    return cast("list[renderers.ToolSpec] | None", tools)


class PackageRenderer:
    """A renderer from the `renderers` package (models it knows by name, or named explicitly)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, name: str | None = None) -> None:
        import renderers

        config = renderers.config_from_name(name) if name else None
        self.name = name or "auto"
        # config_from_name is typed as the base class of the union create_renderer takes.
        self._r = renderers.create_renderer(tokenizer, cast("renderers.RendererConfig", config))

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self._r.get_stop_token_ids())

    def render(self, messages: Messages, *, tools: Tools = None) -> list[int]:
        return list(
            self._r.render_ids(_messages(messages), tools=_tools(tools), add_generation_prompt=True)
        )

    def parse(
        self, completion_ids: list[int], *, tools: Tools = None, prompt_ids: list[int] | None = None
    ) -> dict[str, Any]:
        from renderers import ToolCallParseStatus

        parsed = self._r.parse_response(
            list(completion_ids), tools=_tools(tools), prompt_ids=prompt_ids
        )
        calls = [
            _tool_call(
                c.name or "",
                c.arguments if c.arguments is not None else {},
                c.id or _call_id(completion_ids, i),
            )
            for i, c in enumerate(parsed.tool_calls)
            if c.status == ToolCallParseStatus.OK
        ]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": parsed.content if parsed.content or not calls else None,
        }
        if parsed.reasoning_content:
            message["reasoning_content"] = parsed.reasoning_content
        if calls:
            message["tool_calls"] = calls
        return message

    def extend(
        self,
        prev_prompt_ids: list[int],
        prev_completion_ids: list[int],
        new_messages: Messages,
        *,
        tools: Tools = None,
    ) -> list[int]:
        bridged = self._r.bridge_to_next_turn(
            list(prev_prompt_ids),
            list(prev_completion_ids),
            _messages(new_messages),
            tools=_tools(tools),
        )
        if bridged is None:
            # The package says the template would render history differently (e.g. Qwen3 drops
            # old reasoning at a new user turn, or new_messages holds an assistant turn).
            raise RendererError(
                f"renderer {self.name!r} cannot extend these ids with roles "
                f"{[m.get('role') for m in new_messages]} without re-rendering sampled history; "
                "render the conversation afresh as a new prompt"
            )
        return list(bridged.token_ids)


def make_renderer(tokenizer: PreTrainedTokenizerBase, name: str | None = None) -> Renderer:
    """`name`: "template" (the tokenizer's chat template), a `renderers` name ("qwen3"...) or None
    (the `renderers` renderer when it knows the model by name, else the chat template)."""
    if name == "template":
        return TemplateRenderer(tokenizer)
    if name is not None:
        return PackageRenderer(tokenizer, name)
    from renderers.base import MODEL_RENDERER_MAP

    if tokenizer.name_or_path in MODEL_RENDERER_MAP:
        return PackageRenderer(tokenizer)
    return TemplateRenderer(tokenizer)
