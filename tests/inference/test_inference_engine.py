"""The built-in engine in process: log-prob parity, batching, stops, scoring, weight reload."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from support.bpe_model import IM_END, smollm2_dir, smollm2_tokenizer

from rlbus.clients.renderer import make_renderer
from rlbus.consumers.inference.api import (
    ContextLengthError,
    GenerateResult,
    RequestError,
    SamplingParams,
)
from rlbus.consumers.inference.checkpoint_reader import CheckpointError
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.weights import WeightFollower, newest
from rlbus.schemas import WeightVersion


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama-tiny")
    init_model(path, arch="llama", size="tiny", seed=0)
    return path


@pytest.fixture
async def engine(model_dir: Path, request: pytest.FixtureRequest):
    """The CPU's default (dynamic decode), or as `indirect` parametrization names: "static"
    decodes in a static cache's slots, as on CUDA (there through captured graphs)."""
    decode = getattr(request, "param", "dynamic")
    length = 512 if decode == "static" else None
    async with Engine.from_pretrained(model_dir, decode=decode, cache_length=length) as e:
        yield e


both_decodes = pytest.mark.parametrize("engine", ["dynamic", "static"], indirect=True)


def prompts(engine: Engine, n: int) -> list[list[int]]:
    # Different lengths, so that batching pads and merges rows of unequal length.
    return [
        engine.tokenizer.encode(f"question {i}: " + "why? " * (i % 5), add_special_tokens=False)
        for i in range(n)
    ]


def reference_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    """A separate, unbatched, uncached forward pass over the same ids."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    scaled = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return scaled[len(prompt) - 1 : -1].gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def perturbed_checkpoint(
    model: torch.nn.Module, path: Path, seed: int = 1
) -> dict[str, torch.Tensor]:
    """Save every weight plus noise as one safetensors file (no lm_head duplicate when tied)."""
    generator = torch.Generator().manual_seed(seed)
    state = {
        n: (p.detach() + 0.05 * torch.randn(p.shape, generator=generator)).contiguous()
        for n, p in model.named_parameters()
    }
    save_file(state, str(path))
    return state


@both_decodes
async def test_logprobs_match_a_separate_forward_pass(engine: Engine) -> None:
    batch = prompts(engine, 12)
    params = [
        SamplingParams(max_tokens=24, temperature=t, ignore_eos=True) for t in (1.0, 0.7, 0.0) * 4
    ]
    results = await asyncio.gather(
        *(engine.generate(p, s) for p, s in zip(batch, params, strict=True))
    )
    worst = 0.0
    for prompt, result, s in zip(batch, results, params, strict=True):
        ref = reference_logprobs(engine.model, prompt, result.completion_ids, s.temperature)
        worst = max(worst, (ref - torch.tensor(result.logprobs)).abs().max().item())
    print(f"max |engine log-prob - forward-pass log-prob| = {worst:.2e} (fp32, CPU)")
    assert worst < 1e-4


async def test_score_matches_generation_logprobs(engine: Engine) -> None:
    prompt = prompts(engine, 1)[0]
    result = await engine.generate(prompt, SamplingParams(max_tokens=16, ignore_eos=True))
    scored = await engine.score(prompt, result.completion_ids)
    assert len(scored.logprobs) == 16
    assert max(abs(a - b) for a, b in zip(scored.logprobs, result.logprobs, strict=True)) < 1e-4
    cooler = await engine.score(prompt, result.completion_ids, temperature=0.5)
    ref = reference_logprobs(engine.model, prompt, result.completion_ids, 0.5)
    assert (torch.tensor(cooler.logprobs) - ref).abs().max().item() < 1e-4


async def test_64_concurrent_requests_are_batched(engine: Engine) -> None:
    batch = prompts(engine, 64)
    results = await asyncio.gather(
        *(engine.generate(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in batch)
    )
    assert all(len(r.completion_ids) == 8 and r.finish_reason == "length" for r in results)
    stats = engine.stats()
    assert stats.requests_finished == 64
    assert stats.tokens_generated == 64 * 8
    assert stats.mean_batch_size > 1, stats


@both_decodes
async def test_seeded_requests_repeat_whatever_the_batch(engine: Engine) -> None:
    prompt = prompts(engine, 1)[0]
    alone = await engine.generate(prompt, SamplingParams(max_tokens=12, seed=11))
    crowded = await asyncio.gather(
        engine.generate(prompt, SamplingParams(max_tokens=12, seed=11)),
        *(engine.generate(p, SamplingParams(max_tokens=12)) for p in prompts(engine, 7)),
    )
    assert crowded[0].completion_ids == alone.completion_ids
    other = await engine.generate(prompt, SamplingParams(max_tokens=12, seed=12))
    assert other.completion_ids != alone.completion_ids


async def test_stops_and_finish_reasons(engine: Engine) -> None:
    prompt = prompts(engine, 1)[0]
    free = await engine.generate(
        prompt, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True), text=True
    )
    assert free.finish_reason == "length" and len(free.completion_ids) == 20
    token = free.completion_ids[5]
    by_id = await engine.generate(
        prompt, SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[token])
    )
    assert by_id.finish_reason == "stop" and by_id.stop_reason == token
    assert by_id.completion_ids == free.completion_ids[: free.completion_ids.index(token) + 1]
    assert free.text
    stop = free.text[3:5]
    by_text = await engine.generate(
        prompt,
        SamplingParams(max_tokens=20, temperature=0, stop=[stop], ignore_eos=True),
        text=True,
    )
    assert by_text.finish_reason == "stop" and by_text.stop_reason == stop
    assert by_text.text == free.text[: free.text.index(stop)]
    assert free.completion_ids[: len(by_text.completion_ids)] == by_text.completion_ids
    eos = engine.tokenizer.eos_token_id
    long = await engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0))
    assert long.finish_reason in ("length", "stop") and len(long.completion_ids) == 1
    with pytest.raises(ContextLengthError):
        await engine.generate([1] * engine.max_context, SamplingParams(max_tokens=1))
    with pytest.raises(RequestError):
        await engine.generate([engine.vocab_size + 5], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError):
        SamplingParams(top_p=1.5)
    near_end = await engine.generate(
        [eos] * (engine.max_context - 3), SamplingParams(max_tokens=50, ignore_eos=True)
    )
    assert len(near_end.completion_ids) == 3 and near_end.finish_reason == "length"


async def test_streaming_yields_deltas_then_the_result(engine: Engine) -> None:
    prompt = prompts(engine, 1)[0]
    items = [
        item
        async for item in engine.stream(
            prompt, SamplingParams(max_tokens=10, ignore_eos=True, top_logprobs=3)
        )
    ]
    *deltas, result = items
    assert isinstance(result, GenerateResult)
    assert [t for d in deltas for t in d.token_ids] == result.completion_ids
    assert [lp for d in deltas for lp in d.logprobs] == result.logprobs
    assert "".join(d.text for d in deltas) == result.text
    assert all(len(d.top_logprobs[0]) == 3 for d in deltas)


@both_decodes
async def test_weight_reload_changes_outputs_and_keeps_in_flight_requests(
    engine: Engine, tmp_path: Path
) -> None:
    prompt = prompts(engine, 1)[0]
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    before = await engine.generate(prompt, greedy)
    old_state = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    new_state = perturbed_checkpoint(engine.model, tmp_path / "v1.safetensors")

    # A long request streams while the weights change under it.
    long_params = SamplingParams(max_tokens=300, ignore_eos=True)
    stream = engine.stream(prompt, long_params)
    first = await anext(stream)
    load_s = await engine.load_weights(f"file://{tmp_path / 'v1.safetensors'}", version=1)
    rest = [item async for item in stream]
    spanning = rest[-1]
    assert isinstance(spanning, GenerateResult)
    assert len(spanning.completion_ids) == 300 and spanning.finish_reason == "length"
    assert (spanning.min_policy_version, spanning.max_policy_version) == (0, 1)
    assert spanning.policy_version == 0
    assert first.token_ids == spanning.completion_ids[:1]
    assert load_s > 0

    after = await engine.generate(prompt, greedy)
    assert after.completion_ids != before.completion_ids
    assert (after.min_policy_version, after.max_policy_version) == (1, 1)
    assert engine.policy_version == 1 and engine.stats().weight_loads == 1

    # Each token of the spanning request was sampled by one version given the whole prefix:
    # old weights up to the swap, new weights (with a recomputed cache) after it.
    with torch.no_grad():
        new_ref = reference_logprobs(engine.model, prompt, spanning.completion_ids, 1.0)
        for name, param in engine.model.named_parameters():
            param.copy_(old_state[name])
        old_ref = reference_logprobs(engine.model, prompt, spanning.completion_ids, 1.0)
        for name, param in engine.model.named_parameters():
            param.copy_(new_state[name])
    got = torch.tensor(spanning.logprobs)
    on_old = (got - old_ref).abs() < 1e-4
    on_new = (got - new_ref).abs() < 1e-4
    switch = int(on_new.int().argmax())
    assert 0 < switch < 300
    assert on_old[:switch].all() and on_new[switch:].all()


async def test_bad_checkpoints_are_refused_and_serving_goes_on(
    engine: Engine, tmp_path: Path
) -> None:
    state = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    state.pop("model.norm.weight")
    save_file(state, str(tmp_path / "partial.safetensors"))
    with pytest.raises(CheckpointError, match="missing 1 parameters"):
        await engine.load_weights(str(tmp_path / "partial.safetensors"), version=1)
    state["model.norm.weight"] = torch.ones(3)
    save_file(state, str(tmp_path / "misshaped.safetensors"))
    with pytest.raises(CheckpointError, match="shape mismatches"):
        await engine.load_weights(str(tmp_path / "misshaped.safetensors"), version=1)
    with pytest.raises(CheckpointError, match="does not exist"):
        await engine.load_weights(str(tmp_path / "nowhere"), version=1)
    with pytest.raises(RequestError, match="not newer"):
        await engine.load_weights(str(tmp_path / "partial.safetensors"), version=0)
    assert engine.policy_version == 0
    result = await engine.generate(prompts(engine, 1)[0], SamplingParams(max_tokens=4))
    assert len(result.completion_ids) == 4


async def test_weight_follower_loads_versions_once(engine: Engine, tmp_path: Path) -> None:
    ckpt = tmp_path / "step-3"
    ckpt.mkdir()
    perturbed_checkpoint(engine.model, ckpt / "model.safetensors")
    follower = WeightFollower(engine, worker_id="w1")
    event = WeightVersion(run_id="r", version=3, step=3, uri=str(ckpt))
    loaded = await follower.on_weight_version(event)
    assert loaded is not None and (loaded.version, loaded.worker_id, loaded.uri) == (
        3,
        "w1",
        str(ckpt),
    )
    assert loaded.load_s > 0 and engine.policy_version == 3
    again = await follower.on_weight_version(event)  # a redelivery: no reload, the same event
    assert again == loaded and engine.stats().weight_loads == 1
    # The same worker started again (same worker id): what it publishes is another load, never
    # a second content under the first one's id (bench/faults.py found that conflict).
    restarted = await WeightFollower(engine, worker_id="w1").on_weight_version(event)
    assert restarted is not None and restarted.event_id != loaded.event_id
    assert (
        await follower.on_weight_version(WeightVersion(run_id="r", version=2, uri=str(ckpt)))
        is None
    )
    with pytest.raises(CheckpointError):
        await follower.on_weight_version(
            WeightVersion(run_id="r", version=4, uri=str(ckpt), format="pt")
        )
    picked = newest(
        [
            event,
            WeightVersion(run_id="r", version=9, uri="x"),
            WeightVersion(run_id="other", version=12, uri="y"),
        ],
        "r",
    )
    assert picked is not None and picked.version == 9


@pytest.mark.slow
async def test_smollm2_stops_at_im_end_once_and_the_next_turn_extends_it() -> None:
    """The real SmolLM2-135M-Instruct, greedy: the completion ends with <|im_end|> (its
    generation config's EOS) exactly once, parses to text without it, and the next turn's
    prompt is these ids plus what the template writes after them."""
    tok = smollm2_tokenizer()
    renderer = make_renderer(tok)
    conversation = [
        {"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    prompt = renderer.render(conversation)
    async with Engine.from_pretrained(smollm2_dir()) as engine:
        out = await engine.generate(prompt, SamplingParams(temperature=0, max_tokens=32))
    im_end = tok.convert_tokens_to_ids(IM_END)
    assert out.finish_reason == "stop" and out.stop_reason == im_end
    assert out.completion_ids[-1] == im_end and out.completion_ids.count(im_end) == 1
    message = renderer.parse(out.completion_ids)
    assert "Paris" in message["content"] and IM_END not in message["content"]
    follow = {"role": "user", "content": "And of Italy?"}
    extended = renderer.extend(prompt, out.completion_ids, [follow])
    assert extended[: len(prompt) + len(out.completion_ids)] == prompt + out.completion_ids
    whole = [*conversation, {"role": "assistant", "content": message["content"]}, follow]
    assert tok.decode(extended) == tok.apply_chat_template(
        whole, tokenize=False, add_generation_prompt=True
    )
