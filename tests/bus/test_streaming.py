"""Streams that stream: a long completion from the real tiny-model engine reaches the official
openai and anthropic clients token by token, from the inference server and through the
interception server (chat, Responses, Anthropic messages; eval and train backends), and the
trace still records the exact ids, log-probs and versions once the stream ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from rlbus.bus import free_port
from rlbus.bus.server_thread import ServerThread
from rlbus.clients.inference_client import InferenceClient
from rlbus.clients.renderer import make_renderer
from rlbus.clients.token_api import Delta, GenerateResult, SamplingParams
from rlbus.config.env import ModelConfig, SamplingConfig
from rlbus.consumers.inference.api import InferenceBackend
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.service import build_app, build_backend
from rlbus.producers.interception import EvalBackend, InterceptionServer, TokenBackend

LONG = 160
"""Tokens in the long completion (every token is one byte of the byte-level tokenizer)."""
SEED = 1
"""A sampling seed with which the tiny model (init seed 0) writes more than LONG tokens before
its end of turn, for this prompt."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny")
    init_model(path, arch="llama", size="tiny", seed=0)
    return path


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> InferenceBackend:
    """The real engine, in this process, so that a test can see how far it has sampled."""
    return build_backend(model_dir)


@pytest.fixture(scope="module")
def inference(engine: InferenceBackend, model_dir: Path) -> Iterator[str]:
    """The inference server on the real engine; its /v1 URL."""
    app = build_app(engine, model_dir, model_name="tiny")
    with ServerThread(app, lifespan="on", graceful_s=1, name="inference") as server:
        yield f"{server.url}/v1"


class Arrivals:
    """Each piece of a stream, with how many tokens the engine had sampled when it arrived."""

    def __init__(self, engine: InferenceBackend) -> None:
        self.engine = engine
        self.sampled: list[int] = []
        self.pieces: list[str] = []

    def add(self, piece: str | None) -> None:
        if piece:
            self.sampled.append(self.engine.stats().tokens_generated)
            self.pieces.append(piece)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def streamed(self, at_least: int) -> None:
        """The text came in at least `at_least` pieces, and the engine went on sampling after
        the first had arrived: a buffered answer's pieces all arrive once the engine is done
        with it. (An order of events, not a time: it holds however slow the machine is.)"""
        assert len(self.pieces) >= at_least, self.pieces
        assert self.sampled[0] < self.sampled[-1], self.sampled


async def test_inference_server_streams_chat_as_tokens_are_sampled(
    inference: str, engine: InferenceBackend
) -> None:
    client = openai.AsyncOpenAI(base_url=inference, api_key="k", max_retries=0)
    arrivals = Arrivals(engine)
    stream = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Tell a long story"}],
        max_tokens=LONG,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if chunk.choices:
            arrivals.add(chunk.choices[0].delta.content)
    arrivals.streamed(LONG // 4)


async def test_generate_streams_deltas_then_the_exact_result(
    inference: str, engine: InferenceBackend
) -> None:
    client = InferenceClient(inference)
    deltas: list[Delta] = []
    result: GenerateResult | None = None
    arrivals = Arrivals(engine)
    try:
        sampling = SamplingParams(max_tokens=LONG, ignore_eos=True, seed=SEED)
        async for item in client.generate_stream([1, 2, 3], sampling):
            if isinstance(item, Delta):
                deltas.append(item)
                arrivals.add(item.text or "?")
            else:
                result = item
        again = await client.generate([1, 2, 3], sampling)
    finally:
        await client.close()
    assert result is not None and len(result.completion_ids) == LONG
    assert [t for d in deltas for t in d.token_ids] == result.completion_ids
    assert [lp for d in deltas for lp in d.logprobs] == result.logprobs
    assert again.completion_ids == result.completion_ids  # the same seed draws the same tokens
    arrivals.streamed(LONG // 2)


@pytest.fixture(params=["eval", "train"])
async def intercepted(
    request: pytest.FixtureRequest, inference: str, model_dir: Path
) -> AsyncIterator[InterceptionServer]:
    """The interception server in front of the inference server: eval mode (its chat stream,
    through the openai client) or train mode (its token stream, rendered here)."""
    config = ModelConfig(name="tiny", base_url=inference, mode=request.param)
    if request.param == "eval":
        backend: EvalBackend | TokenBackend = EvalBackend(config)
    else:
        from transformers import AutoTokenizer

        renderer = make_renderer(AutoTokenizer.from_pretrained(model_dir), "template")
        backend = TokenBackend(config, renderer)
    sampling = SamplingConfig(max_tokens=LONG, seed=SEED, logprobs=True)
    async with InterceptionServer(backend, sampling) as server:
        yield server


def recorded(server: InterceptionServer, text: str) -> None:
    """The trace holds the streamed completion whole: its message, a log-prob per sampled
    token, and in train mode the exact ids and the policy version."""
    (session,) = server.sessions.values()
    (call,) = session.trace.calls
    assert call.result.message["content"] == text
    assert call.result.finish_reason == "length" and len(call.result.logprobs) == LONG
    if server.backend.mode == "train":
        assert len(call.result.completion_ids) == LONG and call.result.prompt_ids
        assert call.result.policy_version == 0


Streamer = Callable[[str, str], Any]


async def chat(base_url: str, anthropic_url: str, arrivals: Arrivals) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    stream = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Tell a long story"}], stream=True
    )
    async for chunk in stream:
        if chunk.choices:
            arrivals.add(chunk.choices[0].delta.content)


async def responses(base_url: str, anthropic_url: str, arrivals: Arrivals) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    async with client.responses.stream(model="tiny", input="Tell a long story") as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                arrivals.add(event.delta)
    # Cut at the token limit, the stream ends as OpenAI's does: response.incomplete (the
    # client's get_final_response() expects response.completed and raises).
    assert event.type == "response.incomplete"
    assert event.response.incomplete_details.reason == "max_output_tokens"
    assert event.response.output_text == arrivals.text


async def messages(base_url: str, anthropic_url: str, arrivals: Arrivals) -> None:
    client = anthropic.AsyncAnthropic(base_url=anthropic_url, api_key="k", max_retries=0)
    async with client.messages.stream(
        model="tiny", max_tokens=LONG, messages=[{"role": "user", "content": "Tell a long story"}]
    ) as stream:
        async for text in stream.text_stream:
            arrivals.add(text)
        final = await stream.get_final_message()
    assert final.content[0].text == arrivals.text  # type: ignore[union-attr]


@pytest.mark.parametrize("speak", [chat, responses, messages], ids=lambda f: f.__name__)
async def test_interception_streams_as_the_engine_samples(
    intercepted: InterceptionServer, engine: InferenceBackend, speak: Callable[..., Any]
) -> None:
    with intercepted.session("r-stream") as session:
        arrivals = Arrivals(engine)
        await speak(session.base_url, session.anthropic_base_url, arrivals)
        arrivals.streamed(LONG // 4)
        recorded(intercepted, arrivals.text)


@pytest.mark.slow
async def test_a_stream_refused_upstream_gets_its_status_code() -> None:
    """The first piece is awaited before the response starts: an upstream that cannot answer
    is a status code the client raises on, not a stream that ends early."""
    dead = ModelConfig(name="m", base_url=f"http://127.0.0.1:{free_port()}/v1", timeout_s=5)
    async with InterceptionServer(EvalBackend(dead)) as server:
        with server.session("r-dead") as session:
            client = openai.AsyncOpenAI(base_url=session.base_url, api_key="k", max_retries=0)
            with pytest.raises(openai.APIStatusError, match="upstream") as raised:
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], stream=True
                )
            assert raised.value.status_code == 502
            assert session.trace.calls == [] and session.trace.tips == {}


async def test_eval_streams_record_the_serving_version_and_ids(model_dir: Path) -> None:
    """An eval-mode stream from rlbus's own server, after a weight load to version 3, records
    version 3 and the exact prompt and completion ids; a stream from an endpoint that does not
    tell records the version as unknown, never a made-up 0."""
    from safetensors.torch import save_file
    from support import ScriptedServer

    from rlbus.schemas import UNKNOWN_POLICY_VERSION

    backend = build_backend(model_dir)
    weights = model_dir.parent / "v3.safetensors"
    assert isinstance(backend, Engine)
    save_file({n: p.detach().clone() for n, p in backend.model.named_parameters()}, str(weights))
    app = build_app(backend, model_dir, model_name="tiny")
    sampling = SamplingConfig(max_tokens=8, seed=SEED)
    with ServerThread(app, lifespan="on", graceful_s=1, name="inference-v3") as inference:
        loaded = httpx.post(
            f"{inference.url}/v1/weights", json={"uri": str(weights), "version": 3}, timeout=60
        )
        assert loaded.status_code == 200, loaded.text
        config = ModelConfig(name="tiny", base_url=f"{inference.url}/v1")
        async with InterceptionServer(EvalBackend(config), sampling) as server:
            with server.session("r-v3") as session:
                await chat(session.base_url, session.anthropic_base_url, Arrivals(backend))
            (call,) = session.trace.calls
        client = InferenceClient(f"{inference.url}/v1")
        again = await client.generate(
            call.result.prompt_ids, SamplingParams(max_tokens=8, seed=SEED)
        )
        await client.close()
    result = call.result
    assert result.policy_version == 3
    assert result.prompt_ids and len(result.completion_ids) == len(result.logprobs) == 8
    assert result.completion_ids == again.completion_ids  # the ids the server sampled
    with ScriptedServer() as other:
        config = ModelConfig(name="scripted", base_url=f"{other.url}/v1")
        async with InterceptionServer(EvalBackend(config)) as server:
            with server.session("r-other") as session:
                await chat(session.base_url, session.anthropic_base_url, Arrivals(backend))
            (call,) = session.trace.calls
    assert call.result.policy_version == UNKNOWN_POLICY_VERSION
    assert session.trace.usage()["max_policy_version"] == UNKNOWN_POLICY_VERSION
