"""LoRA adapters served beside the model for scoring (served_adapters.py): one engine and one
copy of the base for several LoRA teachers, each chosen per score request, scoring exactly what
the base with that adapter merged scores."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import typer
from support.loras import lora_file as support_lora_file

from rlbus.bus.server_thread import ServerThread
from rlbus.clients.inference_client import InferenceClient, InferenceError
from rlbus.consumers.inference.api import InferenceBackend, RequestError
from rlbus.consumers.inference.checkpoint_reader import CheckpointError
from rlbus.consumers.inference.engine import Engine
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.service import build_app, build_backend
from rlbus.consumers.trainer.checkpoint import CheckpointStore

ADAPTED = ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama-tiny")
    init_model(path, arch="llama", size="tiny", seed=0)
    return path


def lora_file(model_dir: Path, out: Path, seed: int) -> str:
    return support_lora_file(model_dir, out, seed, ADAPTED, rank=4, scale=0.3)


async def test_each_adapter_scores_as_the_base_with_it_merged(
    model_dir: Path, tmp_path: Path
) -> None:
    adapters = {f"expert{n}": lora_file(model_dir, tmp_path / str(n), n) for n in (1, 2)}
    prompt, completion = [5, 17, 42, 99, 3], [7, 8, 9, 10, 11, 12]
    expected: dict[str | None, list[float]] = {}
    async with Engine.from_pretrained(model_dir) as base:
        expected[None] = (await base.score(prompt, completion)).logprobs
    for name, uri in adapters.items():
        async with Engine.from_pretrained(model_dir) as merged:  # the adapter merged in
            await merged.load_weights(uri, 1)
            expected[name] = (await merged.score(prompt, completion)).logprobs

    engine = Engine.from_pretrained(model_dir)
    for name, uri in adapters.items():
        engine.add_adapter(name, uri)
    async with engine:
        assert engine.adapters == ("expert1", "expert2")
        # Asked together: one engine iteration scores each under its own adapter.
        names: list[str | None] = [None, "expert1", "expert2", "expert1", None, "expert2"]
        got = await asyncio.gather(*(engine.score(prompt, completion, 1.0, n) for n in names))
        for name, result in zip(names, got, strict=True):
            assert result.logprobs == pytest.approx(expected[name], abs=1e-4), name
        assert expected["expert1"] != pytest.approx(expected[None], abs=1e-2)
        assert expected["expert1"] != pytest.approx(expected["expert2"], abs=1e-2)
        with pytest.raises(RequestError, match="no adapter 'expert3' here; .*expert1, expert2"):
            await engine.score(prompt, completion, 1.0, "expert3")


def test_an_adapter_that_does_not_fit_the_model_is_refused_by_name(
    model_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    init_model(other, arch="llama", size="small", seed=0)
    engine = Engine.from_pretrained(model_dir)
    with pytest.raises(CheckpointError, match="adapter 'big' .* does not fit the served model"):
        engine.add_adapter("big", lora_file(other, tmp_path / "big", 1))
    full = CheckpointStore(f"file://{tmp_path / 'full'}").write_weights(
        1, {n: p.detach() for n, p in engine.model.named_parameters()}
    )
    with pytest.raises(CheckpointError, match="adapter 'full' .* holds full weights"):
        engine.add_adapter("full", full.uri)
    assert engine.adapters == ()


async def test_a_score_request_names_its_adapter_as_its_model(
    model_dir: Path, tmp_path: Path
) -> None:
    """Over HTTP, as the orchestrator asks a teacher (InferenceClient.score): the adapter is the
    request's `model`; the model list names the adapters; a name served by neither is refused
    with the names that are."""
    uri = lora_file(model_dir, tmp_path / "1", 1)
    prompt, completion = [5, 17, 42], [7, 8, 9]
    async with Engine.from_pretrained(model_dir) as merged:
        await merged.load_weights(uri, 1)
        expected = (await merged.score(prompt, completion)).logprobs
    backend = build_backend(model_dir, adapters={"expert1": uri})
    await backend.start()
    try:
        listed, got, own = await scored_over_http(backend, model_dir, prompt, completion)
    finally:
        await backend.stop()
    assert got == pytest.approx(expected, abs=1e-4)
    assert own != pytest.approx(expected, abs=1e-2)
    assert listed == ["tiny", "expert1"]


async def scored_over_http(
    backend: InferenceBackend, model_dir: Path, prompt: list[int], completion: list[int]
) -> tuple[list[str], list[float], list[float]]:
    """The served models, and the completion's log-probs by adapter expert1 and by the model."""
    with ServerThread(build_app(backend, model_dir, model_name="tiny")) as server:
        client = InferenceClient(f"{server.url}/v1")
        try:
            got = await client.score(prompt, completion, 1.0, "expert1")
            own = await client.score(prompt, completion, 1.0)
            with pytest.raises(InferenceError, match=r"'expert2' does not exist.*adapters expert1"):
                await client.score(prompt, completion, 1.0, "expert2")
        finally:
            await client.close()
        async with httpx.AsyncClient(base_url=f"{server.url}/v1") as http:
            listed = [m["id"] for m in (await http.get("/models")).json()["data"]]
    return listed, got, own


def test_adapter_options_are_checked_before_anything_loads() -> None:
    """`rlbus worker inference --adapter NAME=URI`: only on a frozen built-in engine, each
    named once."""
    from rlbus.commands.worker import adapter_options

    assert adapter_options(["a=/x.safetensors", "b=s3://w/y"], True, "hf") == {
        "a": "/x.safetensors",
        "b": "s3://w/y",
    }
    for given, frozen, backend, said in (
        (["a=/x"], False, "hf", "serve them with --frozen"),
        (["a=/x"], True, "vllm", "served by --backend hf"),
        (["/x"], True, "hf", "'/x' is not NAME=URI"),
        (["a=/x", "a=/y"], True, "hf", "'a=/y' named twice"),
    ):
        with pytest.raises(typer.BadParameter, match=said):
            adapter_options(given, frozen, backend)  # type: ignore[arg-type]
