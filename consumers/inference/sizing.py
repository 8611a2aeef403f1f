"""How much memory serving a model takes, estimated from its directory's sizes before a weight is
read (consumers/model_size.py): the weights at the serving dtype, the KV cache of the sequences
the engine takes on at once, and the runtime. `check_serving_fits` refuses a model that would
not fit; `rlbus run` adds its replicas to the trainer's estimate (rlbus/launch/run_memory.py).

The built-in engine computes in float32 on a CPU and bfloat16 on a GPU, and admits up to
`MAX_PREFILL_TOKENS` tokens of waiting requests in one prefill: their KV cache is what it holds
at the least once requests queue up (a run's env producers send 64 rollouts at once by
default). The vLLM backend's CPU server takes its KV cache as `inference.vllm.kv_cache_gib`
says (`engine_settings`); on a GPU vLLM sizes itself from `gpu_memory_utilization`, and no
estimate is made here (reading the GPU's free memory would take CUDA memory in this process
that vLLM's engine then lacks).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from rlbus.config.runs import VLLMConfig
from rlbus.consumers.inference.api import BackendKind
from rlbus.consumers.model_size import (
    RUNTIME_BYTES,
    ModelSize,
    NotEnoughMemory,
    available_bytes,
    gb,
    model_size,
)

log = logging.getLogger(__name__)

MAX_PREFILL_TOKENS = 16384
"""Tokens the built-in engine prefills at once at the most (Engine's max_prefill_tokens)."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def engine_dtype(device: str) -> str:
    """What the built-in engine computes in on `device`."""
    return "float32" if device == "cpu" else "bfloat16"


@dataclass(frozen=True)
class ServingEstimate:
    dtype: str
    weights_bytes: int
    kv_bytes: int
    kv_what: str
    """What the KV cache holds ("16,384 tokens (...)")."""
    runtime_bytes: int
    hint: str
    """What to change when it does not fit."""

    @property
    def total(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.runtime_bytes

    def describe(self) -> str:
        return (
            f"~{gb(self.total)} ({gb(self.weights_bytes)} weights in {self.dtype} + "
            f"{gb(self.kv_bytes)} KV cache for {self.kv_what} + {gb(self.runtime_bytes)} runtime)"
        )


def serving_estimate(
    size: ModelSize,
    backend: BackendKind,
    device: str,
    vllm: VLLMConfig | None = None,
    available: int | None = None,
) -> ServingEstimate | None:
    """What one server of the model `size` describes takes; None for vLLM on a GPU.
    `available`: the memory free (vLLM's CPU server sizes its default KV cache from it)."""
    move = "serve a smaller model, or on a device with more memory (--device, inference.device)"
    if backend == "hf":
        dtype = engine_dtype(device)
        per_token = size.kv_per_token * DTYPE_BYTES[dtype]
        what = f"{MAX_PREFILL_TOKENS:,} tokens (one full prefill of the engine)"
        weights = size.params * DTYPE_BYTES[dtype]
        kv = per_token * MAX_PREFILL_TOKENS
        return ServingEstimate(dtype, weights, kv, what, RUNTIME_BYTES, move)
    if device != "cpu":
        return None
    from rlbus.consumers.inference.vllm_backend import engine_settings

    kwargs, env = engine_settings(
        vllm or VLLMConfig(), device, 0, available if available is not None else 0
    )
    gib = int(env["VLLM_CPU_KVCACHE_SPACE"])
    return ServingEstimate(
        kwargs["dtype"],
        size.params * DTYPE_BYTES[kwargs["dtype"]],
        gib << 30,
        f"inference.vllm.kv_cache_gib = {gib}",
        RUNTIME_BYTES,
        f"lower inference.vllm.kv_cache_gib, or {move}",
    )


def check_serving_fits(
    model_path: str | Path,
    backend: BackendKind,
    device: str,
    vllm: VLLMConfig | None = None,
    available: int | None = None,
) -> ServingEstimate | None:
    """Refuse (NotEnoughMemory) a model whose serving estimate exceeds the memory of `device`,
    from the directory's sizes alone; None when no estimate is made."""
    size = model_size(model_path)
    if size is None or (backend == "vllm" and device != "cpu"):
        return None
    free = available if available is not None else available_bytes(device)
    est = serving_estimate(size, backend, device, vllm, free)
    if est is None or free is None:
        return est
    if est.total > free:
        raise NotEnoughMemory(
            f"inference would need {est.describe()} to serve {model_path}; {gb(free)} is "
            f"available on {device}: {est.hint}"
        )
    log.info("inference memory estimate before loading (%s): %s", size.source, est.describe())
    return est
