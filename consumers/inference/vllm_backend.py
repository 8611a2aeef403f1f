"""The inference service on vLLM (GPU extra): same endpoints, vLLM's own batching and weight reload.

vLLM is imported only inside `VLLMBackend.start`, never at package import; it runs in an
environment of its own (`rlbus engine install vllm`), since its transformers pin is older than
the trainer's. The translation between our types and vLLM's is pure functions over vLLM's
documented attribute names (SamplingParams kwargs; RequestOutput.outputs[i].token_ids /
.logprobs / .finish_reason / .stop_reason; RequestOutput.prompt_logprobs; Logprob.logprob /
.rank) and of our engine settings into vLLM's (`engine_settings`), unit-tested without vLLM;
tests/inference/test_vllm_served.py runs the backend on vLLM's CPU build.

Semantics kept equal to the built-in engine:
- log-probs are those of the tempered distribution: the engine is created with
  `logprobs_mode="processed_logprobs"` (vLLM's default returns untempered "raw" log-probs).
  vLLM's processed log-probs are taken after top-p/top-k masking, so with top_p < 1 they are
  those of the truncated distribution; RL sampling uses top_p = 1, where the two agree.
- weight reload keeps requests in flight: `pause_generation(mode="keep", clear_cache=True)`,
  `collective_rpc("reload_weights", kwargs={"weights_path": dir, "is_checkpoint_format": True})`,
  `reset_prefix_cache()`, `resume_generation()`. Frozen requests resume on the new weights
  with a recomputed KV cache: the result's version range spans both versions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from rlbus.config.runs import VLLMConfig
from rlbus.consumers.inference.api import (
    ContextLengthError,
    Delta,
    EngineStats,
    FinishReason,
    GenerateResult,
    RequestError,
    SamplingParams,
    ScoreResult,
    TopLogprob,
    check_prompt,
    check_vocab,
)
from rlbus.consumers.inference.checkpoint_reader import (
    checkpoint_files,
    map_safetensors,
    tensor_names,
    weights_kind,
)

log = logging.getLogger(__name__)

CPU_MAX_MODEL_LEN = 4096
"""The longest context a CPU server takes by default: its KV cache is sized for it."""
CPU_KV_CACHE_MAX_GIB = 8
"""The most KV-cache memory a CPU server takes by default."""
CPU_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**32 - 1), "MALLOC_TRIM_THRESHOLD_": str(2**36)}
"""glibc's allocator in vLLM's CPU processes: every allocation from the heap, and freed heap
kept. A weight update frees each layer's packed weights and allocates the new ones; by default
the large ones are fresh mappings, every page faulted in again (SmolLM2's reload, median over
versions: 0.92 s, 0.68 s with these; the worker holds ~400 MB more, flat over versions:
docs/benchmarks.md). vLLM's CPU docs preload tcmalloc for the same reason. A user's own
MALLOC_* values are kept (`engine_environ`)."""
ENGINE_DEAD_EXIT = 75
"""The inference role's exit code when vLLM's engine process died under it: the role ends (its
launcher reports it by name and may start it again) rather than answer every request 500."""

# ---- pure translation (tested on CPU) ---------------------------------------------------------


def sampling_kwargs(params: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """Keyword arguments for `vllm.SamplingParams` that sample like our engine would."""
    return {
        "n": 1,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": max_tokens,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "seed": params.seed,
        # logprobs=k returns the k most likely tokens plus the sampled one; 0 only the sampled one.
        "logprobs": params.top_logprobs,
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
    }


def score_kwargs() -> dict[str, Any]:
    """A prefill-only request: one throwaway token, log-probs of every prompt position."""
    return {"n": 1, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}


def sampled_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[dict[int, Any]] | None, top_k: int
) -> tuple[list[float], list[list[TopLogprob]] | None]:
    """Sampled-token log-probs (and the top-k lists) from a CompletionOutput's `logprobs`."""
    if logprobs is None:
        raise RequestError("vLLM returned no log-probs: the request must set logprobs >= 0")
    values: list[float] = []
    tops: list[list[TopLogprob]] | None = [] if top_k else None
    for token_id, entry in zip(token_ids, logprobs, strict=True):
        values.append(float(entry[token_id].logprob))
        if tops is not None:
            ranked = sorted(
                (
                    (lp.rank, tid, lp.logprob)
                    for tid, lp in entry.items()
                    if lp.rank is not None and lp.rank <= top_k
                )
            )
            tops.append([TopLogprob(tid, float(lp)) for _, tid, lp in ranked])
    return values, tops


def finish_of(completion: Any, eos_ids: Iterable[int]) -> tuple[FinishReason, int | str | None]:
    """vLLM names EOS stops with stop_reason None; ours names the token, as for other stop ids."""
    reason = completion.finish_reason
    if reason not in ("stop", "length", "abort"):
        raise RequestError(f"vLLM finished with unexpected reason {reason!r}")
    stop_reason = completion.stop_reason
    if (
        reason == "stop"
        and stop_reason is None
        and completion.token_ids
        and completion.token_ids[-1] in set(eos_ids)
    ):
        stop_reason = completion.token_ids[-1]
    return reason, stop_reason


def result_of(
    output: Any, versions: tuple[int, int], eos_ids: Iterable[int], top_k: int, *, text: bool
) -> GenerateResult:
    """Our result from a finished vLLM RequestOutput; `versions` = (first, last) version seen."""
    completion = output.outputs[0]
    token_ids = list(completion.token_ids)
    logprobs, tops = sampled_logprobs(token_ids, completion.logprobs, top_k)
    reason, stop_reason = finish_of(completion, eos_ids)
    return GenerateResult(
        completion_ids=token_ids,
        logprobs=logprobs,
        finish_reason=reason,
        stop_reason=stop_reason,
        prompt_tokens=len(output.prompt_token_ids),
        policy_version=versions[0],
        min_policy_version=versions[0],
        max_policy_version=versions[1],
        text=completion.text if text else None,
        top_logprobs=tops,
    )


def delta_of(output: Any, sent_tokens: int, sent_chars: int, top_k: int) -> Delta:
    """What a cumulative RequestOutput adds after `sent_tokens` ids and `sent_chars` characters."""
    completion = output.outputs[0]
    token_ids = list(completion.token_ids[sent_tokens:])
    entries = completion.logprobs[sent_tokens:] if completion.logprobs is not None else None
    logprobs, tops = sampled_logprobs(token_ids, entries, top_k)
    return Delta(
        token_ids=token_ids, logprobs=logprobs, text=completion.text[sent_chars:], top_logprobs=tops
    )


def score_of(
    prompt_logprobs: Sequence[dict[int, Any] | None], all_ids: Sequence[int], prompt_len: int
) -> list[float]:
    """Log-probs of all_ids[prompt_len:] from RequestOutput.prompt_logprobs (position 0 is None)."""
    if len(prompt_logprobs) != len(all_ids):
        raise RequestError(
            f"vLLM returned {len(prompt_logprobs)} prompt log-probs for {len(all_ids)} ids"
        )
    out = []
    for position in range(prompt_len, len(all_ids)):
        entry = prompt_logprobs[position]
        if entry is None:
            raise RequestError(f"vLLM returned no log-prob at position {position}")
        out.append(float(entry[all_ids[position]].logprob))
    return out


def reload_call(weights_dir: str) -> tuple[str, dict[str, Any]]:
    """The worker RPC that makes vLLM re-read its weights from a local HF-layout directory."""
    return "reload_weights", {"weights_path": weights_dir, "is_checkpoint_format": True}


TIED_HEAD = ("lm_head.weight", "model.embed_tokens.weight")
"""A tied head's name, and the embedding it is tied to (Llama-family naming)."""


def stage_checkpoint(uri: str, into: str | None = None, tied: bool = False) -> str:
    """A local directory holding the checkpoint's safetensors files (vLLM reads local paths).

    A local directory is used as is; a single file or a remote URL is copied first. `tied`: the
    model ties its head to its embedding, and a version leaves the head out (the trainer writes
    each tensor once): vLLM's reload then keeps the head it had, so the staged directory gets
    the head as a file of its own (the checkpoint's files linked beside it, not copied).
    """
    fs, path = fsspec.core.url_to_fs(uri)
    local = isinstance(fs, LocalFileSystem)
    _, files = checkpoint_files(uri)
    head, embedding = TIED_HEAD
    names = tensor_names(fs, files) if tied else set()
    needs_head = tied and head not in names and embedding in names
    if local and fs.isdir(path) and not needs_head:
        return path
    target = into or tempfile.mkdtemp(prefix="rlbus-weights-")
    Path(target).mkdir(parents=True, exist_ok=True)
    for file in files:
        staged = Path(target) / posixpath.basename(file)
        if local:
            staged.unlink(missing_ok=True)
            staged.symlink_to(Path(file).resolve())
        else:
            fs.get(file, str(staged))
    if needs_head:
        from safetensors.torch import save_file

        for staged in sorted(Path(target).glob("*.safetensors")):
            # Mapped: only the embedding's pages are read, on the weight update's path.
            tensors = map_safetensors(str(staged))[1]
            if embedding in tensors:
                save_file({head: tensors[embedding]}, str(Path(target) / "tied_head.safetensors"))
                break
    return target


def engine_settings(
    cfg: VLLMConfig, device: str, model_len: int, available_bytes: int
) -> tuple[dict[str, Any], dict[str, str]]:
    """vLLM engine arguments and environment variables for `cfg` on `device` ("cpu" or a CUDA
    device), a model whose context is `model_len`, with `available_bytes` of memory free."""
    cpu = device == "cpu"
    kwargs: dict[str, Any] = {
        "dtype": cfg.dtype if cfg.dtype != "auto" else ("float32" if cpu else "bfloat16"),
        "enforce_eager": cfg.eager if cfg.eager is not None else cpu,
        "tensor_parallel_size": cfg.tensor_parallel_size,
    }
    if cfg.max_model_len:
        kwargs["max_model_len"] = cfg.max_model_len
    elif cpu:
        kwargs["max_model_len"] = min(model_len, CPU_MAX_MODEL_LEN)
    env: dict[str, str] = {}
    if cpu:
        gib = cfg.kv_cache_gib or min(CPU_KV_CACHE_MAX_GIB, max(1, available_bytes // 4 >> 30))
        env["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
        env |= CPU_ALLOCATOR_ENV
    else:
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    return kwargs, env


def engine_environ(env: dict[str, str], current: Mapping[str, str]) -> dict[str, str]:
    """The environment vLLM's processes get: `current` with `env` (engine_settings') over it,
    but for allocator settings `current` already holds (the user's own)."""
    return {
        **current,
        **{k: v for k, v in env.items() if k not in CPU_ALLOCATOR_ENV or k not in current},
    }


def model_len_of(model_path: str) -> int:
    """The context the model was trained for (its config's max_position_embeddings)."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    return int(config.get("max_position_embeddings") or CPU_MAX_MODEL_LEN)


def available_memory() -> int:
    """Bytes of memory free for new allocations (MemAvailable)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def start_failure(
    model_path: str, kwargs: dict[str, Any], env: dict[str, str], exc: Exception
) -> str:
    """Why vLLM did not start, and the setting that changes it."""
    said = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    if "memory" in said.lower() or "kv cache" in said.lower():
        held = env.get("VLLM_CPU_KVCACHE_SPACE")
        where = (
            f"{held} GiB of KV cache"
            if held
            else f"{kwargs.get('gpu_memory_utilization')} of the GPU"
        )
        hint = (
            f"it was given {where} and max_model_len {kwargs.get('max_model_len', 'the model')}: "
            "lower inference.vllm.kv_cache_gib (a GPU: gpu_memory_utilization) or "
            "inference.vllm.max_model_len (`rlbus worker inference "
            "--inference.vllm.kv-cache-gib 1`)"
        )
    else:
        hint = "its log above says more (inference.vllm.* are the engine's settings)"
    return f"vLLM could not start {model_path}: {said}; {hint}"


# ---- the backend (runs where vLLM is installed: `rlbus engine install vllm`) ------------------


class VLLMBackend:
    """`InferenceBackend` over vLLM's AsyncLLM.

    `stats().mean_batch_size` is the mean number of this server's requests in flight when an
    output arrives: vLLM's scheduler does not report its per-step batch to a client.
    """

    def __init__(
        self,
        model_path: str,
        *,
        policy_version: int = 0,
        seed: int = 0,
        settings: VLLMConfig | None = None,
        device: str = "cpu",
    ) -> None:
        self._path = model_path
        self._seed = seed
        self._settings = settings or VLLMConfig()
        self._device = device
        self.startup_s = 0.0
        """How long vLLM took to start (load, compile and warm up)."""
        self._version = policy_version
        self._engine: Any = None
        self._max_context = 0
        self._vocab_size = 0
        self._eos: frozenset[int] = frozenset()
        self._tied = False
        self._watching: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._in_flight = 0
        self._samples = 0
        self._in_flight_sum = 0
        self._tokens = 0
        self._prompt_tokens = 0
        self._finished = 0
        self._scored = 0
        self._loads = 0

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    async def start(self) -> None:
        kwargs, env = engine_settings(
            self._settings, self._device, model_len_of(self._path), available_memory()
        )
        # Before vLLM is imported: its settings read them, and its engine process inherits them.
        os.environ.update(engine_environ(env, os.environ))
        from transformers import AutoTokenizer
        from vllm import AsyncEngineArgs  # pyright: ignore[reportMissingImports]  # its own venv
        from vllm.v1.engine.async_llm import AsyncLLM  # pyright: ignore[reportMissingImports]  # its own venv

        args = AsyncEngineArgs(
            model=self._path,
            seed=self._seed,
            logprobs_mode="processed_logprobs",
            max_logprobs=20,
            **kwargs,
        )
        started = time.monotonic()
        try:
            self._engine = AsyncLLM.from_engine_args(args)
        except Exception as exc:
            raise RuntimeError(start_failure(self._path, kwargs, env, exc)) from exc
        self.startup_s = time.monotonic() - started
        log.info("vLLM started %s in %.1f s (%s, %s)", self._path, self.startup_s, kwargs, env)
        self._watching = asyncio.create_task(self._exit_when_engine_dies())
        config = self._engine.model_config
        self._tied = bool(getattr(config.hf_config, "tie_word_embeddings", False))
        self._max_context = int(config.max_model_len)
        self._vocab_size = int(config.get_vocab_size())
        eos = AutoTokenizer.from_pretrained(self._path).eos_token_id
        self._eos = frozenset([eos] if eos is not None else [])

    async def _exit_when_engine_dies(self, every_s: float = 1.0) -> None:
        while self._engine is not None and not self._engine.errored:
            await asyncio.sleep(every_s)
        if self._engine is not None:
            log.error(
                "vLLM's engine process died (killed, or out of memory: its log above says which); "
                "the inference role exits with %d",
                ENGINE_DEAD_EXIT,
            )
            logging.shutdown()
            os._exit(ENGINE_DEAD_EXIT)

    async def stop(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

    def _params(self, prompt_ids: list[int], params: SamplingParams) -> Any:
        from vllm import SamplingParams as VLLMSamplingParams  # pyright: ignore[reportMissingImports]  # its own venv

        check_prompt(prompt_ids, self._vocab_size, self._max_context)
        check_vocab(params.stop_token_ids, self._vocab_size, "stop_token_ids")
        room = self._max_context - len(prompt_ids)
        return VLLMSamplingParams(**sampling_kwargs(params, min(params.max_tokens or room, room)))

    async def _outputs(
        self, prompt_ids: list[int], vllm_params: Any
    ) -> AsyncIterator[tuple[Any, int]]:
        self._in_flight += 1
        try:
            async for output in self._engine.generate(
                {"prompt_token_ids": prompt_ids}, vllm_params, uuid.uuid4().hex
            ):
                self._samples += 1
                self._in_flight_sum += self._in_flight
                yield output, self._version
        finally:
            self._in_flight -= 1

    def _count(self, result: GenerateResult) -> None:
        self._tokens += len(result.completion_ids)
        self._prompt_tokens += result.prompt_tokens
        self._finished += 1

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams | None = None, *, text: bool = False
    ) -> GenerateResult:
        params = params or SamplingParams()
        first = last = None
        final = None
        async for output, version in self._outputs(prompt_ids, self._params(prompt_ids, params)):
            first = version if first is None else first
            last, final = version, output
        if final is None or first is None or last is None:
            raise RequestError("vLLM returned no output for the request")
        result = result_of(final, (first, last), self._eos, params.top_logprobs, text=text)
        self._count(result)
        return result

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams | None = None
    ) -> AsyncIterator[Delta | GenerateResult]:
        params = params or SamplingParams()
        first = None
        sent_tokens = sent_chars = 0
        async for output, version in self._outputs(prompt_ids, self._params(prompt_ids, params)):
            first = version if first is None else first
            delta = delta_of(output, sent_tokens, sent_chars, params.top_logprobs)
            sent_tokens += len(delta.token_ids)
            sent_chars += len(delta.text)
            if delta.token_ids or delta.text:
                yield delta
            if output.finished:
                result = result_of(
                    output, (first, version), self._eos, params.top_logprobs, text=True
                )
                self._count(result)
                yield result

    @property
    def adapters(self) -> tuple[str, ...]:
        return ()  # rlbus serves LoRA teachers on the built-in engine (served_adapters.py)

    async def score(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        temperature: float = 1.0,
        adapter: str | None = None,
    ) -> ScoreResult:
        from vllm import SamplingParams as VLLMSamplingParams  # pyright: ignore[reportMissingImports]  # its own venv

        if adapter is not None:
            raise RequestError(f"the vLLM backend serves no adapters here (asked for {adapter!r})")
        if temperature != 1.0:
            # vLLM's prompt log-probs are untempered, and rescaling them is not what vLLM computes.
            raise RequestError("the vLLM backend scores at temperature 1.0 only")
        check_prompt(prompt_ids, self._vocab_size, self._max_context)
        check_vocab(completion_ids, self._vocab_size, "completion_ids")
        ids = list(prompt_ids) + list(completion_ids)
        if len(ids) >= self._max_context:
            raise ContextLengthError(
                f"prompt + completion is {len(ids)} tokens; "
                f"this model's context is {self._max_context}"
            )
        final = None
        version = self._version
        async for output, seen in self._outputs(ids, VLLMSamplingParams(**score_kwargs())):
            final, version = output, seen
        if final is None or final.prompt_logprobs is None:
            raise RequestError("vLLM returned no prompt log-probs")
        self._scored += 1
        return ScoreResult(
            logprobs=score_of(final.prompt_logprobs, ids, len(prompt_ids)), policy_version=version
        )

    async def load_weights(self, uri: str, version: int) -> float:
        async with self._lock:
            if version <= self._version:
                raise RequestError(
                    f"weights version {version} is not newer than the served "
                    f"version {self._version}"
                )
            if await asyncio.to_thread(weights_kind, uri) == "lora-delta":
                raise RequestError(
                    f"weights version {version} at {uri} is LoRA deltas, which the vLLM backend "
                    "does not merge: set trainer.lora.publish = 'merged'"
                )
            loop = asyncio.get_running_loop()
            started = loop.time()
            weights_dir = await asyncio.to_thread(stage_checkpoint, uri, None, self._tied)
            method, kwargs = reload_call(weights_dir)
            await self._engine.pause_generation(mode="keep", clear_cache=True)
            try:
                await self._engine.collective_rpc(method, kwargs=kwargs)
                await self._engine.reset_prefix_cache()
                self._version = version
                self._loads += 1
            finally:
                await self._engine.resume_generation()
                if weights_dir != fsspec.core.url_to_fs(uri)[1]:  # a staged copy: read by now
                    shutil.rmtree(weights_dir, ignore_errors=True)
            return loop.time() - started

    def stats(self) -> EngineStats:
        return EngineStats(
            policy_version=self._version,
            running=self._in_flight,
            waiting=0,
            decode_steps=self._samples,
            mean_batch_size=self._in_flight_sum / self._samples if self._samples else 0.0,
            tokens_generated=self._tokens,
            prompt_tokens=self._prompt_tokens,
            requests_finished=self._finished,
            requests_scored=self._scored,
            weight_loads=self._loads,
        )
