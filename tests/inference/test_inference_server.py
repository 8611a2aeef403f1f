"""The HTTP service on a real uvicorn server (127.0.0.1, free port): the official openai client,
token endpoints, clear 4xx errors, weight reload over HTTP and through the bus."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from safetensors.torch import save_file
from support.bpe_model import IM_END, smollm2_tokenizer, tiny_bpe_model

from rlbus.bus import Bus, Delivery, free_port
from rlbus.clients.inference_client import InferenceClient, InferenceError, healthy
from rlbus.clients.renderer import TemplateRenderer
from rlbus.config import Settings
from rlbus.consumers.inference.api import (
    Delta,
    EngineStats,
    GenerateResult,
    SamplingParams,
    ScoreResult,
)
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.server import create_inference_app
from rlbus.consumers.inference.service import build_app, build_backend
from rlbus.consumers.inference.serving import serve_following_weights
from rlbus.schemas import WeightLoaded, WeightVersion

VERSION = "x-rlbus-policy-version"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny")
    init_model(path, arch="llama", size="tiny", seed=0)
    return path


async def _wait_started(server: uvicorn.Server, task: asyncio.Task) -> None:
    for _ in range(500):
        if server.started:
            return
        if task.done():
            await task
        await asyncio.sleep(0.01)
    raise TimeoutError("uvicorn did not start")


@asynccontextmanager
async def serving(model_dir: Path) -> AsyncIterator[tuple[str, Engine]]:
    port = free_port()
    backend = build_backend(model_dir)
    assert isinstance(backend, Engine)
    app = build_app(backend, model_dir, model_name="tiny")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    await _wait_started(server, task)
    try:
        yield f"http://127.0.0.1:{port}", backend
    finally:
        server.should_exit = True
        await task


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bpe_model(tmp_path_factory.mktemp("bpe"))


@pytest.fixture
async def server(model_dir: Path) -> AsyncIterator[tuple[str, Engine]]:
    async with serving(model_dir) as running:
        yield running


@pytest.fixture
async def http(server: tuple[str, Engine]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server[0], timeout=60) as client:
        yield client


@pytest.fixture
async def oa(server: tuple[str, Engine]) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{server[0]}/v1", api_key="unused", max_retries=0
    ) as client:
        yield client


def save_perturbed(engine: Engine, path: Path) -> None:
    save_file({n: p.detach() * 1.5 for n, p in engine.model.named_parameters()}, str(path))


async def test_openai_client_chat_with_logprobs(
    server: tuple[str, Engine], oa: openai.AsyncOpenAI
) -> None:
    engine = server[1]
    models = await oa.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    reply = await oa.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=12,
        temperature=0.8,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 12
    assert len(choice.logprobs.content) == 12
    assert all(
        len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in choice.logprobs.content
    )
    extra = reply.model_extra
    assert (
        extra["policy_version"] == 0 and len(extra["prompt_token_ids"]) == reply.usage.prompt_tokens
    )
    token_ids = choice.model_extra["token_ids"]
    # The client sees the engine's log-probs: rescoring the same ids at T=0.8 gives them back.
    scored = await engine.score(extra["prompt_token_ids"], token_ids, temperature=0.8)
    assert (
        max(
            abs(a - e.logprob)
            for a, e in zip(scored.logprobs, choice.logprobs.content, strict=True)
        )
        < 1e-4
    )
    raw = await oa.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    assert raw.headers[VERSION] == "0"


async def test_openai_client_streams_with_logprobs_and_usage(oa: openai.AsyncOpenAI) -> None:
    stream = await oa.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=10,
        stream=True,
        logprobs=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finished) == 1 and finished[0].choices[0].finish_reason == "length"
    assert finished[0].model_extra["policy_version"] == 0
    entries = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert len(entries) == 10
    assert chunks[-1].usage.completion_tokens == 10
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(text, str)


async def test_generate_and_score_endpoints(http: httpx.AsyncClient) -> None:
    body = {
        "prompt_ids": [10, 20, 30],
        "sampling": {"max_tokens": 6, "temperature": 0, "ignore_eos": True},
    }
    first = await http.post("/v1/generate", json=body)
    assert first.status_code == 200 and first.headers[VERSION] == "0"
    result = first.json()
    assert len(result["completion_ids"]) == 6 == len(result["logprobs"])
    assert result["finish_reason"] == "length" and result["policy_version"] == 0
    assert (await http.post("/v1/generate", json=body)).json()["completion_ids"] == result[
        "completion_ids"
    ]
    scored = await http.post(
        "/v1/score", json={"prompt_ids": [10, 20, 30], "completion_ids": result["completion_ids"]}
    )
    assert scored.status_code == 200
    assert (
        max(abs(a - b) for a, b in zip(scored.json()["logprobs"], result["logprobs"], strict=True))
        < 1e-4
    )
    stats = (await http.get("/v1/stats")).json()
    assert stats["requests_finished"] == 2 and stats["requests_scored"] == 1


async def test_inference_client_generates_scores_and_names_failures(
    server: tuple[str, Engine],
) -> None:
    client = InferenceClient(f"{server[0]}/v1", timeout_s=60)
    try:
        sampling = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        out = await client.generate([10, 20, 30], sampling)
        assert len(out.completion_ids) == 6 == len(out.logprobs) and out.policy_version == 0
        scored = await client.score([10, 20, 30], out.completion_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(scored, out.logprobs, strict=True)) < 1e-4
        with pytest.raises(InferenceError, match="temperature must be > 0") as bad:
            await client.score([1], [2], 0)
        assert bad.value.status == 400
    finally:
        await client.close()
    assert await asyncio.to_thread(healthy, f"{server[0]}/v1")
    assert not await asyncio.to_thread(healthy, f"http://127.0.0.1:{free_port()}/v1")
    down = InferenceClient(f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(InferenceError, match="unreachable") as unreachable:
        await down.generate([1], SamplingParams(max_tokens=1))
    assert unreachable.value.status == 502
    await down.close()


async def test_64_concurrent_http_requests_are_batched(http: httpx.AsyncClient) -> None:
    bodies = [
        {
            "prompt_ids": list(range(5, 12 + i % 9)),
            "sampling": {"max_tokens": 8, "ignore_eos": True},
        }
        for i in range(64)
    ]
    replies = await asyncio.gather(*(http.post("/v1/generate", json=b) for b in bodies))
    assert all(r.status_code == 200 and len(r.json()["completion_ids"]) == 8 for r in replies)
    stats = (await http.get("/metrics")).json()
    assert stats["requests_finished"] == 64
    assert stats["mean_batch_size"] > 1, stats


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/generate", {"prompt_ids": [1] * 5000}, 400, "context is 2048"),
        (
            "/v1/generate",
            {"prompt_ids": [1], "sampling": {"temperature": -0.5}},
            400,
            "temperature must be >= 0",
        ),
        (
            "/v1/generate",
            {"prompt_ids": [1], "sampling": {"top_p": 0}},
            400,
            "top_p must be in (0, 1]",
        ),
        (
            "/v1/generate",
            {"prompt_ids": [1], "sampling": {"top_p": 1.2}},
            400,
            "top_p must be in (0, 1]",
        ),
        (
            "/v1/generate",
            {"prompt_ids": [1], "sampling": {"max_tokens": 0}},
            400,
            "max_tokens must be >= 1",
        ),
        ("/v1/generate", {"prompt_ids": []}, 400, "prompt_ids is empty"),
        ("/v1/generate", {"prompt_ids": [99999]}, 400, "outside the vocabulary"),
        ("/v1/generate", {"prompt_ids": [1], "model": "gpt-9"}, 404, "does not exist"),
        (
            "/v1/generate",
            {"prompt_ids": [1], "sampling": {"temperature": 1, "best_of": 2}},
            400,
            "best_of",
        ),
        (
            "/v1/score",
            {"prompt_ids": [1], "completion_ids": [2], "temperature": 0},
            400,
            "temperature must be > 0",
        ),
        (
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": "x" * 3000}]},
            400,
            "context",
        ),
        (
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": -1},
            400,
            "temperature",
        ),
        (
            "/v1/chat/completions",
            {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
            404,
            "model_not_found",
        ),
        (
            "/v1/chat/completions",
            {"model": "tiny", "messages": []},
            400,
            "messages must not be empty",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "tiny",
                "stream": True,
                "messages": [{"role": "user", "content": "x" * 3000}],
            },
            400,
            "context_length_exceeded",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "x"}],
                "n": 2,
                "stream": True,
            },
            400,
            "n > 1",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "x"}],
                "presence_penalty": 1,
            },
            400,
            "not supported",
        ),
        ("/v1/weights", {"uri": "/nowhere", "version": 5}, 400, "does not exist"),
    ],
)
async def test_bad_requests_get_4xx_and_the_server_keeps_serving(
    http: httpx.AsyncClient, path: str, body: dict, status: int, needle: str
) -> None:
    reply = await http.post(path, json=body)
    assert reply.status_code == status, reply.text
    assert needle in reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if "sampling" in body:
        assert error["param"] == "sampling"
    assert reply.headers[VERSION] == "0"
    ok = await http.post("/v1/generate", json={"prompt_ids": [1, 2], "sampling": {"max_tokens": 2}})
    assert ok.status_code == 200


async def test_malformed_json_and_openai_client_errors(
    http: httpx.AsyncClient, oa: openai.AsyncOpenAI
) -> None:
    reply = await http.post(
        "/v1/generate", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert reply.status_code == 400
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await oa.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="top_p"):
        await oa.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], top_p=0
        )
    assert (
        await oa.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
    ).choices


@pytest.mark.slow
async def test_weight_reload_over_http_keeps_a_streaming_request(
    server: tuple[str, Engine], http: httpx.AsyncClient, oa: openai.AsyncOpenAI, tmp_path: Path
) -> None:
    engine = server[1]
    body = {
        "prompt_ids": [5, 6, 7],
        "sampling": {"max_tokens": 8, "temperature": 0, "ignore_eos": True},
    }
    before = (await http.post("/v1/generate", json=body)).json()
    save_perturbed(engine, tmp_path / "v1.safetensors")
    stream = await oa.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "go"}],
        max_tokens=400,
        stream=True,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    # The opening chunk goes out before any token: reload only once a token came at version 0.
    chunks = [await anext(stream)]
    while not chunks[-1].choices[0].logprobs:
        chunks.append(await anext(stream))
    loaded = await http.post(
        "/v1/weights", json={"uri": str(tmp_path / "v1.safetensors"), "version": 1}
    )
    assert loaded.status_code == 200 and loaded.json()["version"] == 1
    chunks += [c async for c in stream]
    closing = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert closing.choices[0].finish_reason == "length"
    assert (
        closing.model_extra["min_policy_version"],
        closing.model_extra["max_policy_version"],
    ) == (0, 1)
    after = await http.post("/v1/generate", json=body)
    assert after.headers[VERSION] == "1" and after.json()["policy_version"] == 1
    assert after.json()["completion_ids"] != before["completion_ids"]
    stale = await http.post(
        "/v1/weights", json={"uri": str(tmp_path / "v1.safetensors"), "version": 1}
    )
    assert stale.status_code == 400 and "not newer" in stale.text


async def test_worker_follows_weights_on_the_bus(
    model_dir: Path, settings: Settings, tmp_path: Path
) -> None:
    port = free_port()
    backend = build_backend(model_dir)
    assert isinstance(backend, Engine)
    app = build_app(backend, model_dir, model_name="tiny")
    stop = asyncio.Event()
    worker = asyncio.create_task(
        serve_following_weights(settings, backend, app, "127.0.0.1", port, stop, worker_id="w-test")
    )
    loaded: list[WeightLoaded] = []
    seen = asyncio.Event()

    async def collect(deliveries: list[Delivery]) -> None:
        loaded.extend(d.event for d in deliveries if isinstance(d.event, WeightLoaded))
        if loaded:
            seen.set()

    try:
        async with Bus.of(settings) as bus:
            watcher = asyncio.create_task(
                bus.subscriber("weights", group="test-watch", batch=True)(collect).run(seen)
            )
            # Published before the worker may have joined: it reads the topic from the start.
            save_perturbed(backend, tmp_path / "model.safetensors")
            await bus.publish(WeightVersion(version=1, step=1, uri=str(tmp_path)))
            await asyncio.wait_for(seen.wait(), timeout=60)
            await watcher
        assert [(e.version, e.worker_id, e.run_id) for e in loaded] == [
            (1, "w-test", settings.run_id)
        ]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            health = (await http.get("/health")).json()
        assert health["policy_version"] == 1
    finally:
        stop.set()
        await asyncio.wait_for(worker, timeout=30)


class ScriptedBackend:
    """Answers every request with the same completion ids: a stand-in model that calls tools."""

    policy_version = 7
    max_context = 2048
    vocab_size = 265
    adapters = ()

    def __init__(self, completion_ids: list[int]) -> None:
        self.completion_ids = completion_ids

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    def _result(self, prompt_ids: list[int]) -> GenerateResult:
        n = len(self.completion_ids)
        return GenerateResult(
            completion_ids=self.completion_ids,
            logprobs=[-0.5] * n,
            finish_reason="stop",
            stop_reason=self.completion_ids[-1],
            prompt_tokens=len(prompt_ids),
            policy_version=7,
            min_policy_version=7,
            max_policy_version=7,
            text="",
        )

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, text: bool = False
    ) -> GenerateResult:
        return self._result(prompt_ids)

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[Delta | GenerateResult]:
        for token in self.completion_ids:
            yield Delta(token_ids=[token], logprobs=[-0.5], text="raw")
        yield self._result(prompt_ids)

    async def score(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        temperature: float = 1.0,
        adapter: str | None = None,
    ) -> ScoreResult:
        return ScoreResult(logprobs=[-0.5] * len(completion_ids), policy_version=7)

    async def load_weights(self, uri: str, version: int) -> float:
        return 0.0

    def stats(self) -> EngineStats:
        return EngineStats(
            policy_version=7,
            running=0,
            waiting=0,
            decode_steps=0,
            mean_batch_size=0.0,
            tokens_generated=0,
            prompt_tokens=0,
            requests_finished=0,
            requests_scored=0,
            weight_loads=0,
        )


async def test_tool_calls_come_back_parsed(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer.encode(
        'Checking. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>',
        add_special_tokens=False,
    ) + [tokenizer.eos_token_id]
    app = create_inference_app(
        ScriptedBackend(ids), TemplateRenderer(tokenizer), lambda t: tokenizer.decode([t]), "tiny"
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    await _wait_started(server, task)
    tools = [
        {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    ]
    try:
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0
        ) as oa:
            reply = await oa.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Oslo?"}], tools=tools
            )
            choice = reply.choices[0]
            assert choice.finish_reason == "tool_calls"
            assert choice.message.content == "Checking. "
            call = choice.message.tool_calls[0]
            assert (call.function.name, call.function.arguments) == ("weather", '{"city": "Oslo"}')
            assert reply.model_extra["policy_version"] == 7
            stream = await oa.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Oslo?"}],
                tools=tools,
                stream=True,
            )
            chunks = [c async for c in stream]
            # With tools the raw text is not streamed; the parsed message arrives in the last chunk.
            assert all(not c.choices[0].delta.content for c in chunks[:-1])
            last = chunks[-1].choices[0]
            assert last.finish_reason == "tool_calls" and last.delta.content == "Checking. "
            assert last.delta.tool_calls[0].function.arguments == '{"city": "Oslo"}'
    finally:
        server.should_exit = True
        await task


async def test_n_choices_with_a_seed_differ_and_repeat(oa: openai.AsyncOpenAI) -> None:
    kwargs = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "n": 2,
        "seed": 5,
        "extra_body": {"ignore_eos": True, "return_token_ids": True},
    }
    first = await oa.chat.completions.create(**kwargs)
    second = await oa.chat.completions.create(**kwargs)
    ids = [c.model_extra["token_ids"] for c in first.choices]
    assert ids[0] != ids[1]
    assert [c.model_extra["token_ids"] for c in second.choices] == ids
    assert first.usage.completion_tokens == 16


async def test_chat_endpoint_renders_the_callers_system_message_in_place_of_the_default(
    bpe_dir: Path,
) -> None:
    """SmolLM2's ChatML template writes its own system prompt when there is none; the caller's
    system message replaces it (one system block), and without one the template's stays."""
    tok = smollm2_tokenizer()
    system = "Reverse the text you are given. Answer with the reversed text only."
    async with serving(bpe_dir) as (url, _), httpx.AsyncClient(base_url=url, timeout=60) as http:
        texts = []
        for lead in ([{"role": "system", "content": system}], []):
            body = {
                "model": "tiny",
                "messages": [*lead, {"role": "user", "content": "abc"}],
                "max_tokens": 2,
                "return_token_ids": True,
            }
            answer = await http.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            texts.append(tok.decode(answer.json()["prompt_token_ids"]))
    with_system, without = texts
    assert with_system == (
        f"<|im_start|>system\n{system}{IM_END}\n<|im_start|>user\nabc{IM_END}\n"
        "<|im_start|>assistant\n"
    )
    assert without.count("<|im_start|>system\n") == 1 and "SmolLM" in without
