"""The interception server with the official clients (openai chat + Responses, anthropic), streaming
and not, against a real scripted upstream on 127.0.0.1; trace recording, sampling from the run
config, OpenTelemetry spans, and train-mode prompts extended from recorded ids."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support import ScriptedModel, ScriptedServer
from support.bpe_model import IM_END, smollm2_dir, smollm2_tokenizer

from rlbus.bus import telemetry
from rlbus.environment import (
    Environment,
    ModelConfig,
    SamplingConfig,
    load_environment,
)
from rlbus.producers.interception import (
    EvalBackend,
    InterceptionServer,
    TokenBackend,
)
from rlbus.producers.rollouts import RolloutOutput, RolloutRunner
from rlbus.schemas.packed import logprobs, mask, tokens
from rlbus.schemas.samples import trace_samples

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CALL = {
    "id": "call_7",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
}
ADD_TOOL = {
    "name": "add",
    "description": "Add.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


def tool_script(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """Calls `add` when offered tools and no result is in yet; otherwise answers with what it
    saw."""
    if tools and not any(m["role"] == "tool" for m in messages):
        return {"content": None, "tool_calls": [CALL]}
    tool = next((m["content"] for m in messages if m["role"] == "tool"), None)
    return {"content": f"sum={tool}" if tool else f"seen {len(messages)} messages"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedModel(chat=tool_script)) as server:
        yield server


@pytest.fixture
async def server(upstream: ScriptedServer) -> AsyncIterator[InterceptionServer]:
    upstream.model.calls.clear()
    backend = EvalBackend(ModelConfig(name="scripted", base_url=f"{upstream.url}/v1"))
    async with InterceptionServer(backend, SamplingConfig(temperature=0.25, max_tokens=77)) as s:
        yield s


async def test_openai_chat_plain_and_streaming(
    server: InterceptionServer, upstream: ScriptedServer
) -> None:
    with server.session("r-chat") as session:
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key="k", max_retries=0)
        reply = await client.chat.completions.create(
            model="anything", messages=[{"role": "user", "content": "hi"}], temperature=1.5
        )
        assert reply.choices[0].message.content == "seen 1 messages" and reply.model == "scripted"
        assert reply.choices[0].finish_reason == "stop" and reply.usage is not None
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model="x",
                messages=[
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "seen 1 messages"},
                    {"role": "user", "content": "again"},
                ],
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "seen 3 messages" and chunks[-1].usage is not None
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        models = await client.models.list()
        assert [m.id for m in models.data] == ["scripted"]
    # The run's sampling won over the client's temperature; unset fields passed through.
    assert [(c["temperature"], c["max_tokens"], c["model"]) for c in upstream.model.calls] == [
        (0.25, 77, "scripted")
    ] * 2
    trace = session.trace
    assert [(n.branch, n.message["role"], n.call is not None) for n in trace.nodes] == [
        ("main", "user", False),
        ("main", "assistant", True),
        ("main", "user", False),
        ("main", "assistant", True),
    ]
    assert trace.completion() == [
        {"role": "assistant", "content": "seen 1 messages"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "seen 3 messages"},
    ]


async def test_openai_tool_calls_round_trip(server: InterceptionServer) -> None:
    with server.session("r-tools") as session:
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key="k", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "add 1 and 2"}]
        first = await client.chat.completions.create(
            model="m", messages=messages, tools=[{"type": "function", "function": ADD_TOOL}]
        )
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "add"
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "3"},
        ]
        second = await client.chat.completions.create(
            model="m", messages=messages, tools=[{"type": "function", "function": ADD_TOOL}]
        )
        assert second.choices[0].message.content == "sum=3"
    assert {n.branch for n in session.trace.nodes} == {"main"} and len(session.trace.calls) == 2
    # the rollout records what it was offered once, however many calls offered it
    assert session.trace.tools == [{"type": "function", "function": ADD_TOOL}]


async def test_openai_responses_plain_and_streaming(server: InterceptionServer) -> None:
    with server.session("r-responses") as session:
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key="k", max_retries=0)
        tools = [{"type": "function", **ADD_TOOL}]
        first = await client.responses.create(
            model="m", instructions="be brief", input="add", tools=tools
        )
        call = first.output[0]
        assert (
            call.type == "function_call"
            and call.call_id == "call_7"
            and json.loads(call.arguments) == {"a": 1, "b": 2}
        )
        follow_up = [
            {"role": "user", "content": "add"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "3"},
        ]
        second = await client.responses.create(
            model="m", instructions="be brief", input=follow_up, tools=tools
        )
        assert second.output_text == "sum=3" and second.usage.output_tokens > 0
        events = [
            e async for e in await client.responses.create(model="m", input="hello", stream=True)
        ]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert (
            "".join(e.delta for e in events if e.type == "response.output_text.delta")
            == "seen 1 messages"
        )
        async with client.responses.stream(model="m", input="hello") as stream:
            final = await stream.get_final_response()
        assert final.output_text == "seen 1 messages"
    # The follow-up continued the first call's branch (system + user + call + output + answer).
    assert [n.branch for n in session.trace.nodes[:5]] == ["main"] * 5


async def test_anthropic_messages_plain_and_streaming(server: InterceptionServer) -> None:
    with server.session("r-anthropic") as session:
        client = anthropic.AsyncAnthropic(
            base_url=session.anthropic_base_url, api_key="k", max_retries=0
        )
        tools = [{"name": "add", "description": "Add.", "input_schema": ADD_TOOL["parameters"]}]
        first = await client.messages.create(
            model="claude-x",
            max_tokens=64,
            system="be brief",
            tools=tools,
            messages=[{"role": "user", "content": "add"}],
        )
        use = first.content[0]
        assert (
            first.stop_reason == "tool_use"
            and use.type == "tool_use"
            and use.input == {"a": 1, "b": 2}
        )
        second = await client.messages.create(
            model="claude-x",
            max_tokens=64,
            system="be brief",
            tools=tools,
            messages=[
                {"role": "user", "content": "add"},
                {"role": "assistant", "content": first.content},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "3"}],
                },
            ],
        )
        assert second.content[0].text == "sum=3" and second.stop_reason == "end_turn"
        async with client.messages.stream(
            model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            text = await stream.get_final_text()
            final = await stream.get_final_message()
        assert text == "seen 1 messages" and final.usage.output_tokens > 0
        streamed_tool = await client.messages.create(
            model="claude-x",
            max_tokens=64,
            tools=tools,
            stream=True,
            messages=[{"role": "user", "content": "add"}],
        )
        kinds = [e.type async for e in streamed_tool]
        assert (
            kinds[0] == "message_start"
            and kinds[-1] == "message_stop"
            and "content_block_delta" in kinds
        )
    assert [n.branch for n in session.trace.nodes[:5]] == ["main"] * 5


async def test_unknown_or_finished_rollout_is_refused(server: InterceptionServer) -> None:
    with server.session("r-done") as session:
        url = session.base_url
    client = openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="no longer served"):
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{server.url}/r/guess/v1/messages", json={"max_tokens": 1, "messages": []}
        )
    assert response.status_code == 401 and response.json()["type"] == "error"


async def test_parallel_calls_from_one_point_get_their_own_branches(
    server: InterceptionServer,
) -> None:
    import asyncio

    with server.session("r-branches") as session:
        prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        results = await asyncio.gather(*(session.chat(prompt) for _ in range(3)))
        await session.chat([*prompt, results[0].message, {"role": "user", "content": "more"}])
    nodes, _ = session.trace.events("g")
    assert sorted({n.branch_id for n in nodes}) == ["b1", "b2", "main"]
    roots = [n for n in nodes if not n.parent_id]
    assert len(roots) == 1  # the shared prefix is stored once
    sampled = [n for n in nodes if n.sampled]
    assert len(sampled) == 4 and len({n.parent_id for n in sampled[:3]}) == 1


async def test_each_call_records_its_own_duration_and_end(
    server: InterceptionServer, upstream: ScriptedServer
) -> None:
    """Model time apart from harness time: a record's duration_s covers the backend call only,
    and its ts is when that call ended, not when the rollout's events were published."""
    import asyncio
    import time

    upstream.model.delay_s = 0.3
    try:
        with server.session("r-timing") as session:
            began = time.time()
            first = await session.chat([{"role": "user", "content": "hi"}])
            await asyncio.sleep(0.5)  # the harness's own time: a tool, a user turn
            await session.chat(
                [{"role": "user", "content": "hi"}, first.message, {"role": "user", "content": "?"}]
            )
            ended = time.time()
    finally:
        upstream.model.delay_s = 0.0
    _, records = session.trace.events("g")
    assert [r.call_index for r in records] == [0, 1]
    assert all(r.duration_s >= 0.3 for r in records), [r.duration_s for r in records]
    assert began + 0.3 <= records[0].ts < records[1].ts - 0.8 < ended - 0.8
    # The second call began after the first ended and the harness slept: its duration does
    # not reach back over the harness's time.
    assert records[1].ts - records[1].duration_s >= records[0].ts + 0.5


async def test_model_call_spans_carry_gen_ai_attributes(server: InterceptionServer) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer(provider.get_tracer("test"))
    try:
        with server.session("r-span") as session:
            await session.chat([{"role": "user", "content": "hi"}], temperature=0.9)
    finally:
        telemetry.use_tracer(None)
    (span,) = exporter.get_finished_spans()
    attrs = dict(span.attributes or {})
    assert span.name == "chat scripted"
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "scripted"
    assert attrs["gen_ai.request.temperature"] == 0.25 and attrs["gen_ai.request.max_tokens"] == 77
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
    assert attrs["rlbus.rollout_id"] == "r-span"


async def test_train_mode_three_turns_extend_recorded_ids(tmp_path: Path) -> None:
    from rlbus.clients.renderer import make_renderer
    from rlbus.consumers.inference.byte_tokenizer import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    eos = tokenizer.eos_token_id
    turns = iter(range(100))
    # Guesses 10, 11, 12: never right, so the scripted user keeps the game going for all 3 turns.
    scripted = ScriptedModel(
        tokens=lambda ids: [*str(10 + next(turns)).encode(), eos], policy_version=3
    )
    env = load_environment(
        str(EXAMPLES / "guess_number"), {"harness": {"max_turns": 3}, "model": {"mode": "train"}}
    )
    task = next(iter(env.tasks("r")))
    with ScriptedServer(scripted) as token_server:
        config = ModelConfig(name="tiny", base_url=f"{token_server.url}/v1", mode="train")
        async with InterceptionServer(
            TokenBackend(config, make_renderer(tokenizer, "template"))
        ) as server:
            out = await RolloutRunner(env, server).run(task, "group", 0, 1)
    assert out.rollout.status == "ok", out.rollout.error
    assert (out.rollout.num_turns, out.rollout.max_policy_version) == (3, 3)
    calls = [(list(tokens(r.prompt_ids)), list(tokens(r.completion_ids))) for r in out.tokens]
    assert len(calls) == 3
    for (prev_prompt, prev_completion), (prompt, _) in itertools.pairwise(calls):
        assert prompt[: len(prev_prompt) + len(prev_completion)] == prev_prompt + prev_completion
    feedback = "Higher." if 11 < int(task.answer) else "Lower."
    added = tokenizer.decode(calls[2][0][len(calls[1][0]) + len(calls[1][1]) :])
    assert added == f"\n<|im_start|>user\n{feedback}<|im_end|>\n<|im_start|>assistant\n"
    # The trace alone reproduces every prompt: the ids along the path to a call's parent node.
    by_id = {n.node_id: n for n in out.nodes}
    for record in out.tokens:
        node = by_id[record.node_id]
        path, parent = [], by_id.get(node.parent_id)
        while parent is not None:
            path.append(parent)
            parent = by_id.get(parent.parent_id)
        assert [t for n in reversed(path) for t in tokens(n.token_ids)] == list(
            tokens(record.prompt_ids)
        )
    (sample,) = trace_samples(out.nodes, out.tokens)
    full = calls[2][0] + calls[2][1]
    assert list(tokens(sample.input_ids)) == full
    sampled_positions = [i for i, m in enumerate(mask(sample.loss_mask)) if m]
    assert len(sampled_positions) == sum(len(c) for _, c in calls)
    assert [full[i] for i in sampled_positions] == [t for _, c in calls for t in c]
    assert list(logprobs(sample.inference_logprobs)[sampled_positions]) == [-0.25] * len(
        sampled_positions
    )


# ---- SmolLM2's real BPE tokenizer and ChatML template (train mode) ------------------------------


async def _train_rollout(
    env_dir: str, overrides: dict[str, Any], script: Any, tokenizer: Any
) -> tuple[Environment, RolloutOutput]:
    """One rollout in train mode: a scripted token upstream, SmolLM2's template renderer."""
    from rlbus.clients.renderer import make_renderer

    env = load_environment(str(EXAMPLES / env_dir), {**overrides, "model": {"mode": "train"}})
    task = next(iter(env.tasks("r")))
    with ScriptedServer(ScriptedModel(tokens=script, policy_version=2)) as token_server:
        config = ModelConfig(name="smollm2", base_url=f"{token_server.url}/v1", mode="train")
        async with InterceptionServer(TokenBackend(config, make_renderer(tokenizer))) as server:
            out = await RolloutRunner(env, server).run(task, "group", 0, 1)
    assert out.rollout.status == "ok", out.rollout.error
    return env, out


REVERSE_TEXT = "rlbus.environment.reverse_text"


def _calls(out: RolloutOutput) -> list[tuple[list[int], list[int]]]:
    return [(list(tokens(r.prompt_ids)), list(tokens(r.completion_ids))) for r in out.tokens]


def _assert_extended(calls: list[tuple[list[int], list[int]]]) -> None:
    for (prev_prompt, prev_completion), (prompt, _) in itertools.pairwise(calls):
        assert prompt[: len(prev_prompt) + len(prev_completion)] == prev_prompt + prev_completion


@pytest.mark.parametrize(
    "taskset",
    [f"{REVERSE_TEXT}:{name}" for name in ("ReverseText", "TerseReverseText")],
)
async def test_train_mode_the_env_system_prompt_is_the_only_system_block(taskset: str) -> None:
    """SmolLM2's template writes its own system prompt when the messages have none; an env's
    system prompt must stand in its place, once. A task with none keeps the template's."""
    tok = smollm2_tokenizer()
    env, out = await _train_rollout(
        "reverse_text",
        {"taskset": taskset},
        lambda ids: [*tok.encode("cba", add_special_tokens=False), tok.eos_token_id],
        tok,
    )
    ((prompt, completion),) = _calls(out)
    text = tok.decode(prompt)
    assert text.count("<|im_start|>system\n") == 1
    default = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    default_system = default[: default.index("<|im_start|>user")]
    assert "SmolLM" in default_system  # what the template injects when given no system message
    system = env.taskset.system_prompt
    if system:
        assert text.startswith(f"<|im_start|>system\n{system}{IM_END}\n<|im_start|>user\n")
        assert "SmolLM" not in text
    else:
        assert text.startswith(default_system)
    assert completion[-1] == tok.convert_tokens_to_ids(IM_END)


async def test_train_mode_asks_to_stop_at_the_templates_end_of_turn() -> None:
    """A tokenizer whose EOS is not the token its template ends a turn with (a base model's
    <|endoftext|> under ChatML): the renderer stops at <|im_end|> too, and train mode asks the
    inference server to stop there."""
    from transformers import AutoTokenizer

    from rlbus.clients.renderer import make_renderer

    tok = AutoTokenizer.from_pretrained(smollm2_dir(), eos_token="<|endoftext|>")
    im_end = tok.convert_tokens_to_ids(IM_END)
    renderer = make_renderer(tok)
    assert renderer.stop_token_ids == [tok.eos_token_id, im_end]
    scripted = ScriptedModel(tokens=lambda ids: [42, im_end])
    with ScriptedServer(scripted) as token_server:
        config = ModelConfig(name="m", base_url=f"{token_server.url}/v1", mode="train")
        async with InterceptionServer(TokenBackend(config, renderer)) as server:
            with server.session("r-stop") as session:
                client = openai.AsyncOpenAI(base_url=session.base_url, api_key="k", max_retries=0)
                reply = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
    assert reply.choices[0].message.content == tok.decode([42])
    (body,) = scripted.calls
    assert body["sampling"]["stop_token_ids"] == [tok.eos_token_id, im_end]


async def test_train_mode_guess_number_extends_bpe_ids_and_matches_the_template() -> None:
    """Three turns with SmolLM2's BPE tokenizer: each prompt starts with the previous prompt +
    completion ids, and the whole stream decodes to the template's rendering of the rollout
    (the one boundary: the last completion ends at <|im_end|>, before the template's newline)."""
    tok = smollm2_tokenizer()
    guesses = iter(range(10, 100))
    env, out = await _train_rollout(
        "guess_number",
        {"harness": {"max_turns": 3}},
        lambda ids: [*tok.encode(f" {next(guesses)}", add_special_tokens=False), tok.eos_token_id],
        tok,
    )
    calls = _calls(out)
    assert len(calls) == 3
    _assert_extended(calls)
    prompt, completion = calls[-1]
    # The referee's last reply came after the last call.
    *sampled, last = out.rollout.completion
    assert last["role"] == "user" and sampled[-1]["role"] == "assistant"
    rendered = tok.apply_chat_template([*out.rollout.prompt, *sampled], tokenize=False)
    assert tok.decode(prompt + completion) + "\n" == rendered
    assert tok.decode(prompt + completion).count("<|im_start|>system\n") == 1


async def test_train_mode_tool_calls_extend_bpe_ids() -> None:
    """A tool environment with SmolLM2's BPE tokenizer: the tool call's sampled ids stay in the
    next prompt as sampled, the tool result follows as the template renders it."""
    tok = smollm2_tokenizer()
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "2 + 3"}}</tool_call>'
    replies = iter([call, "5"])
    env, out = await _train_rollout(
        "calculator",
        {},
        lambda ids: [*tok.encode(next(replies), add_special_tokens=False), tok.eos_token_id],
        tok,
    )
    calls = _calls(out)
    assert len(calls) == 2
    _assert_extended(calls)
    first_prompt, first_completion = calls[0]
    assert tok.decode(first_completion) == call + IM_END
    assistant, tool_result, answer = out.rollout.completion
    assert assistant["tool_calls"][0]["function"]["name"] == "calculate"
    assert (tool_result["role"], tool_result["content"], answer["content"]) == ("tool", "5", "5")
    added = tok.decode(calls[1][0][len(first_prompt) + len(first_completion) :])
    assert added == f"\n<|im_start|>tool\n5{IM_END}\n<|im_start|>assistant\n"
    # The template renders history with the call's text as the assistant's content.
    sampled = {**assistant, "content": call}
    rendered = tok.apply_chat_template(
        [*out.rollout.prompt, sampled, tool_result], tokenize=False, add_generation_prompt=True
    )
    assert tok.decode(calls[1][0]) == rendered
