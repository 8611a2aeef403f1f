"""Tiny local models, their tokenizer and template, renderers, sampling, incremental text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from rlbus.clients.renderer import (
    PackageRenderer,
    RendererError,
    TemplateRenderer,
    make_renderer,
)
from rlbus.commands.model import model_app
from rlbus.consumers.inference.detok import TextStream
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.sampling import RowSettings, sample


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3-tiny")
    init_model(path, arch="qwen3", size="tiny")
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_init_loads_with_plain_auto_classes(tmp_path: Path, arch: str) -> None:
    params = init_model(tmp_path, arch=arch, size="tiny", seed=3)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert params == sum(p.numel() for p in model.parameters())
    assert 500_000 < params < 1_500_000
    assert model.config.vocab_size == len(tokenizer)
    assert (tmp_path / "model.safetensors").exists()
    text = "héllo ✓ <tool_call>"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 4)


def test_same_seed_same_weights(tmp_path: Path) -> None:
    init_model(tmp_path / "a", seed=1)
    init_model(tmp_path / "b", seed=1)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model.safetensors"
    ).read_bytes()


def test_cli_init_writes_a_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        model_app, ["init", str(tmp_path / "m"), "--arch", "qwen3", "--seed", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "parameters" in result.output
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "qwen3"
    bad = CliRunner().invoke(model_app, ["init", str(tmp_path / "x"), "--arch", "gpt2"])
    assert bad.exit_code != 0


def test_template_renders_tools_and_tool_turns(qwen3_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
    ]
    text = tokenizer.decode(TemplateRenderer(tokenizer).render(messages, tools=tools))
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools.")
    assert '{"type": "function", "function": {"name": "add"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}'
        "</tool_call><|im_end|>\n" in text
    )
    assert text.endswith(
        "<|im_start|>tool\n<tool_response>4</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_parse_completion_into_message_with_tool_calls(qwen3_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    renderer = TemplateRenderer(tokenizer)
    completion = tokenizer.encode(
        'Let me add. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        "<tool_call>{not json}</tool_call>",
        add_special_tokens=False,
    ) + [tokenizer.eos_token_id]
    message = renderer.parse(completion)
    assert (
        message["content"] == "Let me add. <tool_call>{not json}</tool_call>"
    )  # a malformed call stays visible
    assert message["tool_calls"] == [
        {
            "id": message["tool_calls"][0]["id"],
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1}'},
        }
    ]
    only_call = renderer.parse(
        tokenizer.encode(
            '<tool_call>{"name": "f", "arguments": {}}</tool_call>', add_special_tokens=False
        )
    )
    assert only_call["content"] is None and only_call["tool_calls"][0]["function"]["name"] == "f"


def test_extend_appends_only_new_turns_to_recorded_ids(qwen3_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    renderer = make_renderer(tokenizer)
    assert isinstance(renderer, TemplateRenderer)
    history = [{"role": "user", "content": "hi"}]
    prompt = renderer.render(history)
    sampled = tokenizer.encode("ok ✓", add_special_tokens=False) + [tokenizer.eos_token_id]
    new = [{"role": "user", "content": "again"}]
    extended = renderer.extend(prompt, sampled, new)
    assert extended[: len(prompt) + len(sampled)] == prompt + sampled
    assert extended == renderer.render([*history, renderer.parse(sampled), *new])
    # A completion cut by max_tokens gets the turn close the template would have written.
    assert renderer.extend(prompt, sampled[:-1], new) == extended
    # Half a character (two of the three bytes of "✓") decodes to U+FFFD, which re-encodes to
    # other bytes: re-rendering would change what was sampled, extending keeps it.
    broken = tokenizer.encode("ok ", add_special_tokens=False) + [
        0xE2,
        0x9C,
        tokenizer.eos_token_id,
    ]
    kept = renderer.extend(prompt, broken, new)
    assert kept[: len(prompt) + len(broken)] == prompt + broken
    assert kept != renderer.render([*history, renderer.parse(broken), *new])
    with pytest.raises(RendererError):
        renderer.extend(prompt, sampled, [])


def test_package_renderer_for_a_named_model_family(qwen3_dir: Path) -> None:
    # The tiny tokenizer uses Qwen's special tokens, so renderers' Qwen3 renderer runs on it.
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    renderer = make_renderer(tokenizer, "qwen3")
    assert isinstance(renderer, PackageRenderer)
    prompt = renderer.render([{"role": "user", "content": "hi"}])
    assert tokenizer.decode(prompt) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    completion = tokenizer.encode(
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', add_special_tokens=False
    ) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    message = renderer.parse(completion, prompt_ids=prompt)
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    extended = renderer.extend(
        prompt, completion, [{"role": "tool", "content": "2", "tool_call_id": "c"}]
    )
    assert extended[: len(prompt) + len(completion)] == prompt + completion
    assert tokenizer.decode(extended[len(prompt) + len(completion) :]).endswith(
        "<|im_start|>assistant\n"
    )
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in renderer.stop_token_ids


def test_text_stream_stops_and_holds_back_partial_stop_strings(qwen3_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    stream = TextStream(lambda ids: tokenizer.decode(ids, skip_special_tokens=True), ["END"])
    pieces = []
    for token in tokenizer.encode("añb EN", add_special_tokens=False):
        stream.push(token)
        pieces.append(stream.flush())
    assert "".join(pieces) == "añb "  # "EN" could still become "END"
    assert "\ufffd" not in "".join(pieces)  # the two bytes of "ñ" came out together
    for token in tokenizer.encode("D tail", add_special_tokens=False):
        stream.push(token)
    assert stream.stopped_by == "END"
    assert stream.text == "añb "
    assert stream.finish() == ""


def test_sampling_respects_top_p_greedy_and_seeds() -> None:
    logits = torch.tensor([[3.0, 2.0, 0.0, -1.0]]).repeat(3, 1)
    shared = torch.Generator().manual_seed(0)
    rows = RowSettings.build(
        [1.0, 0.0, 2.0], [0.8, 1.0, 1.0], [None, None, None], 0, torch.device("cpu")
    )
    seen = [set() for _ in range(3)]
    for _ in range(300):
        drawn = sample(logits, rows, shared)
        for row, token in enumerate(drawn.tokens.tolist()):
            seen[row].add(token)
    assert seen[0] == {0, 1}  # p(0) = 0.71 < 0.8, so the nucleus is {0, 1}
    assert seen[1] == {0}
    assert seen[2] == {0, 1, 2, 3}
    drawn = sample(logits, rows, shared)
    expected = (
        torch.log_softmax(logits / torch.tensor([[1.0], [1.0], [2.0]]), dim=-1)
        .gather(-1, drawn.tokens[:, None])
        .squeeze(-1)
    )
    assert torch.allclose(drawn.logprobs, expected)

    def seeded(seed: int, shared_seed: int) -> list[int]:
        gens = [torch.Generator().manual_seed(seed), None]
        settings = RowSettings.build([1.0, 1.0], [1.0, 1.0], gens, 0, torch.device("cpu"))
        flat = torch.zeros(2, 50)
        return [
            sample(flat, settings, torch.Generator().manual_seed(shared_seed)).tokens[0].item()
            for _ in range(5)
        ]

    assert seeded(7, 1) == seeded(7, 2)  # the seeded row ignores the shared generator
