"""Assemble a servable app from a model directory: backend + renderer + HTTP routes."""

from __future__ import annotations

from pathlib import Path

import torch
from starlette.types import ASGIApp

from rlbus.clients.renderer import make_renderer
from rlbus.config.runs import HFEngineConfig, VLLMConfig
from rlbus.consumers.inference.api import BackendKind, InferenceBackend
from rlbus.consumers.inference.server import create_inference_app
from rlbus.consumers.inference.sizing import engine_dtype


def build_backend(
    model_path: str | Path,
    backend: BackendKind = "hf",
    *,
    device: str = "cpu",
    policy_version: int = 0,
    seed: int = 0,
    vllm: VLLMConfig | None = None,
    hf: HFEngineConfig | None = None,
    adapters: dict[str, str] | None = None,
) -> InferenceBackend:
    """The engine for `model_path`: the built-in one (fp32 on a CPU, bf16 on a GPU) with its
    settings `hf`, also scoring with `adapters` ({name: LoRA weights URI}), or vLLM with its
    engine settings `vllm`."""
    if backend == "hf":
        from rlbus.consumers.inference.engine import Engine

        hf = hf or HFEngineConfig()
        dtype = getattr(torch, engine_dtype(device))
        engine = Engine.from_pretrained(
            model_path,
            device=device,
            dtype=dtype,
            policy_version=policy_version,
            seed=seed,
            decode=hf.decode,
            cache_length=hf.cache_length or None,
        )
        for name, uri in (adapters or {}).items():
            engine.add_adapter(name, uri)
        return engine
    if adapters:
        raise ValueError(f"the {backend} backend serves no adapters; --backend hf does")
    if backend == "vllm":
        # Imported here so that the package never needs vLLM unless asked for.
        from rlbus.consumers.inference.vllm_backend import VLLMBackend

        return VLLMBackend(
            str(model_path), policy_version=policy_version, seed=seed, settings=vllm, device=device
        )
    raise ValueError(f"unknown backend {backend!r}; choose hf or vllm")


def build_app(
    backend: InferenceBackend,
    model_path: str | Path,
    *,
    model_name: str | None = None,
    renderer: str | None = None,
) -> ASGIApp:
    """The HTTP app for `backend`, serving `model_path` as `model_name` (default: its directory)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    name = model_name or Path(model_path).name
    return create_inference_app(
        backend,
        make_renderer(tokenizer, renderer),
        lambda token_id: tokenizer.decode([token_id]),
        name,
        aliases=(str(model_path),),
    )
