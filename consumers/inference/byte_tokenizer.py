"""A byte-level tokenizer built locally (nothing downloaded), with a ChatML-style template.

Every byte is one token, so any UTF-8 text round-trips and the vocabulary stays tiny
(256 bytes + a few specials), which keeps the tiny models' embeddings small. The special
tokens use Qwen's names so that `renderers`' Qwen3 renderer also works on these tokenizers.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD = "<|endoftext|>"
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD, TURN_START, TURN_END)
# Tool and reasoning markers are ordinary (non-special) added tokens, so they survive
# `skip_special_tokens=True` when a completion is decoded.
MARKER_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

# Jinja string literals carry the newlines (`'\n'`), never the template text itself, so
# whitespace control cannot eat them. Tool calls are rendered exactly as the renderer parses
# them back: <tool_call>{"name": ..., "arguments": ...}</tool_call>.
CHAT_TEMPLATE = r"""
{%- set ns = namespace(system='', start=0) -%}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set ns.system = messages[0]['content'] -%}
  {%- set ns.start = 1 -%}
{%- endif -%}
{%- if tools -%}
  {%- if ns.system -%}{%- set ns.system = ns.system ~ '\n\n' -%}{%- endif -%}
  {%- set ns.system = ns.system ~ 'You can call these tools. To call one, write '
        ~ '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>.\n' -%}
  {%- for tool in tools -%}{%- set ns.system = ns.system ~ (tool | tojson) ~ '\n' -%}{%- endfor -%}
{%- endif -%}
{%- if ns.system -%}{{- '<|im_start|>system\n' ~ ns.system ~ '<|im_end|>\n' -}}{%- endif -%}
{%- for message in messages[ns.start:] -%}
  {%- if message['role'] == 'assistant' -%}
    {{- '<|im_start|>assistant\n' ~ (message['content'] or '') -}}
    {%- for call in message.get('tool_calls') or [] -%}
      {%- set fn = call['function'] if call['function'] is defined else call -%}
      {%- set args = fn['arguments'] if fn['arguments'] is string
                     else (fn['arguments'] | tojson) -%}
      {{- '<tool_call>{"name": ' ~ (fn['name'] | tojson) ~ ', "arguments": ' ~ args
          ~ '}</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message['role'] == 'tool' -%}
    {{- '<|im_start|>tool\n<tool_response>' ~ message['content']
        ~ '</tool_response><|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' ~ message['role'] ~ '\n' ~ message['content'] ~ '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()


def _byte_alphabet() -> list[str]:
    """The printable character ByteLevel pre-tokenization maps each byte to, in byte order."""
    keep = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars: dict[int, str] = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return [chars[b] for b in range(256)]


def build_byte_tokenizer() -> PreTrainedTokenizerFast:
    """Token id == byte value for ids 0..255; specials and markers follow."""
    vocab = {char: byte for byte, char in enumerate(_byte_alphabet())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=TURN_END,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=1 << 30,
    )
