"""The built-in inference engine: a transformers model driven by a batching loop on its own thread.

Requests arrive from asyncio (the HTTP server, the bus worker, tests); one engine thread
owns the model and, at every iteration, (1) applies a pending weight swap, (2) scores waiting
`score` requests (each under the LoRA adapter it names, if any: served_adapters.py), (3) runs
one decode step for every running sequence at once and (4) prefills newly arrived sequences and
merges them into the running batch. Torch releases
the GIL inside its kernels, so the event loop keeps serving while the model runs.

Weight reload and in-flight requests: a swap happens between two steps. Running sequences
are not dropped and not finished on the old weights; their KV cache is recomputed with the
new weights (one prefill over prompt + tokens so far) and they go on. Every token is thus
sampled by exactly one version given the whole prefix, and the result says which versions
took part (`min_policy_version` / `max_policy_version`). This keeps one copy of the weights
in memory and matches what vLLM does with `pause_generation(mode="keep", clear_cache=True)`,
so both backends mean the same thing by a version range.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Self

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from rlbus.bus.heap import RELEASE_EVERY_S, release_free_heap
from rlbus.consumers.inference.adapters import AdapterMerger
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
from rlbus.consumers.inference.attention import (
    allowed_attention_backends,
    attention_backends,
    attention_implementation,
)
from rlbus.consumers.inference.batch import PaddedBatch
from rlbus.consumers.inference.checkpoint_reader import match_parameters, read_checkpoint
from rlbus.consumers.inference.detok import TextStream
from rlbus.consumers.inference.packed_linear import pack_linears
from rlbus.consumers.inference.sampling import RowSettings, sample
from rlbus.consumers.inference.served_adapters import ServedAdapters
from rlbus.consumers.inference.sizing import MAX_PREFILL_TOKENS
from rlbus.consumers.inference.slots import SlotBatch

log = logging.getLogger(__name__)


def _resolve(future: asyncio.Future, value: object) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
    """Run `fn(*args)` on the requester's event loop; a loop that has closed wants nothing more."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        log.debug("dropped a reply to a closed event loop")


@dataclass(eq=False)
class _Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    max_new: int
    stop_ids: frozenset[int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    deltas: asyncio.Queue | None
    text: TextStream | None
    want_text: bool
    generator: torch.Generator | None
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[TopLogprob]] | None = None
    min_version: int = -1
    max_version: int = -1
    stop_reason: int | str | None = None
    aborted: bool = False

    def advance(
        self, token: int, logprob: float, top: list[TopLogprob] | None, version: int
    ) -> FinishReason | None:
        self.completion.append(token)
        self.logprobs.append(logprob)
        if self.top is not None and top is not None:
            self.top.append(top)
        if self.min_version < 0:
            self.min_version = version
        self.max_version = version
        if token in self.stop_ids:
            self.stop_reason = token
            return "stop"
        if self.text is not None:
            self.text.push(token)
            if self.text.stopped_by is not None:
                self.stop_reason = self.text.stopped_by
                return "stop"
        if len(self.completion) >= self.max_new:
            return "length"
        return None

    def result(self, reason: FinishReason) -> GenerateResult:
        return GenerateResult(
            completion_ids=self.completion,
            logprobs=self.logprobs,
            finish_reason=reason,
            stop_reason=self.stop_reason,
            prompt_tokens=len(self.prompt_ids),
            policy_version=self.min_version,
            min_policy_version=self.min_version,
            max_policy_version=self.max_version,
            text=self.text.text if self.text is not None and self.want_text else None,
            top_logprobs=self.top,
        )


@dataclass(eq=False)
class _ScoreJob:
    ids: list[int]
    prompt_len: int
    temperature: float
    adapter: str | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


@dataclass(eq=False)
class _WeightSwap:
    pairs: list[tuple[torch.nn.Parameter, torch.Tensor]]
    version: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


_STOP = object()

Decode = Literal["dynamic", "static"]


@dataclass
class _Counters:
    decode_steps: int = 0
    decode_rows: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    requests_finished: int = 0
    requests_scored: int = 0
    weight_loads: int = 0


class Engine:
    """Continuous-batching generation, prefill-only scoring and hot weight reload for one model."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        policy_version: int = 0,
        max_batch_size: int = 256,
        max_prefill_tokens: int = MAX_PREFILL_TOKENS,
        seed: int = 0,
        decode: Decode = "dynamic",
        cache_length: int | None = None,
    ) -> None:
        """`decode`: "dynamic", running sequences in one padded batch whose cache grows as they
        do (batch.py), or "static", in the slots of a cache allocated once, `cache_length`
        positions each (default: the context, or what half the free memory holds), whose steps
        on CUDA replay captured graphs (slots.py, decode_graphs.py)."""
        PaddedBatch.check_supported(model)
        self.model = model.eval()
        pack_linears(model)
        self.tokenizer = tokenizer
        text_config = model.config.get_text_config()
        self._max_context = int(text_config.max_position_embeddings)
        self._vocab_size = int(text_config.vocab_size)
        self._eos = self._eos_ids(model, tokenizer)
        self._max_batch_size = max_batch_size
        self._max_prefill_tokens = max_prefill_tokens
        self._generator = torch.Generator(device=model.device).manual_seed(seed)
        # Applied by the engine thread around its loop (process-wide flags: attention.py).
        self._attention_backends = attention_backends(model.device)
        log.info(
            "attention %s, SDPA backends %s",
            model.config._attn_implementation,
            "torch's choice"
            if self._attention_backends is None
            else [b.name for b in self._attention_backends],
        )
        self._version = policy_version
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._swap_lock = asyncio.Lock()
        self._adapters = AdapterMerger(model)
        self._served = ServedAdapters(model)
        self._counters = _Counters()
        # Owned by the engine thread from here on.
        self._waiting: deque[_Sequence] = deque()
        self._scores: list[_ScoreJob] = []
        self._swap: _WeightSwap | None = None
        self._rows: list[_Sequence] = []
        self._batch: PaddedBatch | SlotBatch | None = None
        self._next: torch.Tensor | None = None
        self._settings: RowSettings | None = None
        self._slots: SlotBatch | None = None
        self.capture_s = 0.0
        """Seconds the decode steps' CUDA graphs took to capture (static decode on CUDA)."""
        if decode == "static":
            self._slots = self._static_batch(cache_length)
            self._max_context = min(self._max_context, self._slots.length)

    def _static_batch(self, length: int | None) -> SlotBatch:
        implementation = self.model.config._attn_implementation
        if implementation not in ("sdpa", "eager"):
            raise ValueError(
                f"static decode passes its own attention masks, which sdpa and eager attention "
                f"take; this model's attention is {implementation!r} (use decode='dynamic')"
            )
        batch = SlotBatch(self.model, self._max_batch_size, length)
        log.info("static KV cache: %d slots x %d positions", batch.slots, batch.length)
        if self.model.device.type == "cuda":
            from rlbus.consumers.inference.decode_graphs import DecodeGraphs

            with torch.inference_mode(), allowed_attention_backends(self._attention_backends):
                try:
                    self.capture_s = DecodeGraphs(batch).capture()
                except RuntimeError as exc:
                    raise RuntimeError(
                        f"capturing the decode step as CUDA graphs failed: {exc}; serve without "
                        'them with inference.hf.decode = "dynamic" (rlbus worker inference '
                        "--inference.hf.decode dynamic)"
                    ) from exc
        return batch

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        policy_version: int = 0,
        max_batch_size: int = 256,
        seed: int = 0,
        decode: Decode | Literal["auto"] = "auto",
        cache_length: int | None = None,
    ) -> Engine:
        """`decode` "auto": static (CUDA graphs) on CUDA, dynamic elsewhere (Engine)."""
        # sdpa named outright on CUDA (the backends chosen for it apply to sdpa alone); left to
        # transformers' default elsewhere.
        implementation = attention_implementation(device)
        extra = {} if implementation is None else {"attn_implementation": implementation}
        # transformers' annotations take `to`'s first argument for self
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra).to(device)  # pyright: ignore[reportArgumentType]
        tokenizer = AutoTokenizer.from_pretrained(path)
        return cls(
            model,
            tokenizer,
            policy_version=policy_version,
            max_batch_size=max_batch_size,
            seed=seed,
            decode=("static" if model.device.type == "cuda" else "dynamic")
            if decode == "auto"
            else decode,
            cache_length=cache_length,
        )

    @staticmethod
    def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
        ids: set[int] = set()
        for source in (
            model.generation_config.eos_token_id,
            model.config.eos_token_id,
            tokenizer.eos_token_id,
        ):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(i) for i in source)
        return frozenset(ids)

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="rlbus-inference-engine", daemon=True
            )
            self._thread.start()

    async def stop(self) -> None:
        if self._thread is not None:
            self._inbox.put(_STOP)
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- requests (called from asyncio) ------------------------------------------------------

    def _submit(
        self, prompt_ids: list[int], params: SamplingParams, *, want_text: bool, stream: bool
    ) -> _Sequence:
        if self._thread is None:
            raise RuntimeError(
                "engine is not started: call `await engine.start()` or use `async with engine`"
            )
        check_prompt(prompt_ids, self._vocab_size, self._max_context)
        check_vocab(params.stop_token_ids, self._vocab_size, "stop_token_ids")
        room = self._max_context - len(prompt_ids)
        loop = asyncio.get_running_loop()
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self._eos)
        want_text = want_text or stream
        seq = _Sequence(
            prompt_ids=list(prompt_ids),
            params=params,
            max_new=min(params.max_tokens or room, room),
            stop_ids=frozenset(stop_ids),
            loop=loop,
            future=loop.create_future(),
            deltas=asyncio.Queue() if stream else None,
            text=TextStream(self._decode, params.stop) if want_text or params.stop else None,
            want_text=want_text,
            generator=None
            if params.seed is None
            else torch.Generator(device=self.model.device).manual_seed(params.seed),
            top=[] if params.top_logprobs else None,
        )
        self._inbox.put(seq)
        return seq

    def _decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        assert isinstance(text, str)  # one sequence of ids decodes to one string
        return text

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams | None = None, *, text: bool = False
    ) -> GenerateResult:
        seq = self._submit(prompt_ids, params or SamplingParams(), want_text=text, stream=False)
        try:
            return await seq.future
        except asyncio.CancelledError:
            seq.aborted = True
            raise

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams | None = None
    ) -> AsyncIterator[Delta | GenerateResult]:
        seq = self._submit(prompt_ids, params or SamplingParams(), want_text=True, stream=True)
        assert seq.deltas is not None
        done = False
        try:
            while not done:
                item = await seq.deltas.get()
                if isinstance(item, BaseException):
                    raise item
                done = isinstance(item, GenerateResult)
                yield item
        finally:
            if not done:
                seq.aborted = True

    @property
    def adapters(self) -> tuple[str, ...]:
        """The adapters it scores with (add_adapter), by name."""
        return self._served.names

    def add_adapter(self, name: str, uri: str) -> None:
        """Score with the LoRA deltas at `uri` when a request names `name`, besides the weights
        as loaded (served_adapters.py); before start. CheckpointError when they do not fit."""
        if self._thread is not None:
            raise RuntimeError("adapters are added before the engine starts")
        self._served.add(name, uri)

    async def score(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        temperature: float = 1.0,
        adapter: str | None = None,
    ) -> ScoreResult:
        if self._thread is None:
            raise RuntimeError("engine is not started")
        if adapter is not None and adapter not in self._served.names:
            served = ", ".join(self._served.names) or "none"
            raise RequestError(f"no adapter {adapter!r} here; adapters served: {served}")
        check_prompt(prompt_ids, self._vocab_size, self._max_context)
        ids = list(prompt_ids) + list(completion_ids)
        if len(ids) > self._max_context:
            raise ContextLengthError(
                f"prompt + completion is {len(ids)} tokens; "
                f"this model's context is {self._max_context}"
            )
        check_vocab(completion_ids, self._vocab_size, "completion_ids")
        loop = asyncio.get_running_loop()
        job = _ScoreJob(ids, len(prompt_ids), temperature, adapter, loop, loop.create_future())
        self._inbox.put(job)
        return await job.future

    async def load_weights(self, uri: str, version: int) -> float:
        """Read a safetensors checkpoint (fsspec): full weights, or LoRA deltas merged onto the
        base weights; serve it as `version` from the next step."""
        if self._thread is None:
            raise RuntimeError("engine is not started")
        async with self._swap_lock:
            if version <= self._version:
                raise RequestError(
                    f"weights version {version} is not newer than the served "
                    f"version {self._version}"
                )
            started = time.perf_counter()

            def prepare() -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
                checkpoint = read_checkpoint(uri)
                if checkpoint.kind == "lora-delta":
                    pairs = self._adapters.pairs(checkpoint.tensors, version)
                else:
                    pairs = match_parameters(self.model, checkpoint.tensors)
                    self._adapters.full_loaded(version)
                return [(p, t.to(device=p.device, dtype=p.dtype)) for p, t in pairs]

            pairs = await asyncio.to_thread(prepare)
            loop = asyncio.get_running_loop()
            swap = _WeightSwap(pairs, version, loop, loop.create_future())
            self._inbox.put(swap)
            await swap.future
            return time.perf_counter() - started

    def stats(self) -> EngineStats:
        c = self._counters
        return EngineStats(
            policy_version=self._version,
            running=len(self._rows),
            waiting=len(self._waiting),
            decode_steps=c.decode_steps,
            mean_batch_size=c.decode_rows / c.decode_steps if c.decode_steps else 0.0,
            tokens_generated=c.tokens_generated,
            prompt_tokens=c.prompt_tokens,
            requests_finished=c.requests_finished,
            requests_scored=c.requests_scored,
            weight_loads=c.weight_loads,
        )

    # ---- the engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        # Every forward pass of the engine runs on this thread, inside this loop. The heap its
        # batches free goes back on this thread too (between passes, never during one): when it
        # goes idle, and every few seconds while it is busy (bus/heap.py).
        released, worked = time.monotonic(), False
        with torch.inference_mode(), allowed_attention_backends(self._attention_backends):
            while True:
                idle = not (self._rows or self._waiting or self._scores or self._swap)
                if worked and (idle or time.monotonic() - released >= RELEASE_EVERY_S):
                    release_free_heap()
                    released, worked = time.monotonic(), False
                if not self._take_inbox(block=idle):
                    break
                try:
                    self._iterate()
                    worked = True
                except Exception as exc:  # a failed step must fail its requests, never hang them
                    log.exception("inference step failed; failing the requests it held")
                    self._fail_all(RuntimeError(f"inference step failed: {exc!r}"))
        self._fail_all(RuntimeError("inference engine stopped"))

    def _take_inbox(self, block: bool) -> bool:
        """Move submitted work into the engine's queues; False once stop was asked for."""
        items = [self._inbox.get()] if block else []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for item in items:
            if item is _STOP:
                return False
            if isinstance(item, _Sequence):
                self._waiting.append(item)
            elif isinstance(item, _ScoreJob):
                self._scores.append(item)
            else:
                self._swap = item
        return True

    def _iterate(self) -> None:
        if self._swap is not None:
            self._apply_swap(self._swap)
            self._swap = None
        if self._scores:
            self._run_scores()
        self._drop_aborted()
        if self._rows:
            self._decode_step()
        if self._waiting and len(self._rows) < self._max_batch_size:
            self._admit()

    def _apply_swap(self, swap: _WeightSwap) -> None:
        for param, tensor in swap.pairs:
            param.copy_(tensor)
        self._version = swap.version
        self._counters.weight_loads += 1
        # Cached keys/values came from the old weights: running sequences go back to the front
        # of the queue and are prefilled again (prompt + tokens so far) with the new ones.
        self._waiting.extendleft(reversed(self._rows))
        self._set_rows([], None, None)
        _post(swap.loop, _resolve, swap.future, None)

    def _run_scores(self) -> None:
        jobs, self._scores = self._scores, []
        by_adapter: dict[str | None, list[_ScoreJob]] = {}
        for job in jobs:
            by_adapter.setdefault(job.adapter, []).append(job)
        for adapter, scored in by_adapter.items():
            with self._served.applied(adapter):
                for chunk in self._chunks(scored):
                    try:
                        self._score_chunk(chunk)
                    except Exception as exc:  # fails these scores only; generations go on
                        log.exception("scoring %d requests failed", len(chunk))
                        for job in chunk:
                            failed = RuntimeError(f"scoring failed: {exc!r}")
                            _post(job.loop, _fail, job.future, failed)

    def _score_chunk(self, jobs: list[_ScoreJob]) -> None:
        width = max(len(j.ids) for j in jobs)
        device = self.model.device
        ids = torch.zeros((len(jobs), width), dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for row, job in enumerate(jobs):
            ids[row, width - len(job.ids) :] = torch.tensor(job.ids)
            mask[row, width - len(job.ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
        ).logits
        for row, job in enumerate(jobs):
            start = width - len(job.ids) + job.prompt_len
            # logits at position i predict token i + 1
            scored = torch.log_softmax(
                logits[row, start - 1 : width - 1].float() / job.temperature, dim=-1
            )
            targets = ids[row, start:width]
            values = scored.gather(-1, targets[:, None]).squeeze(-1).tolist()
            self._counters.requests_scored += 1
            _post(
                job.loop,
                _resolve,
                job.future,
                ScoreResult(logprobs=values, policy_version=self._version),
            )

    def _chunks(self, jobs: list[_ScoreJob]) -> list[list[_ScoreJob]]:
        """Split scoring into forward passes of at most max_prefill_tokens (at least one job)."""
        chunks: list[list[_ScoreJob]] = [[]]
        budget = self._max_prefill_tokens
        for job in jobs:
            n = len(job.ids)
            if chunks[-1] and n > budget:
                chunks.append([])
                budget = self._max_prefill_tokens
            chunks[-1].append(job)
            budget -= n
        return chunks

    def _drop_aborted(self) -> None:
        if any(s.aborted for s in self._waiting):
            self._waiting = deque(s for s in self._waiting if not s.aborted)
        if any(s.aborted for s in self._rows):
            keep = [i for i, s in enumerate(self._rows) if not s.aborted]
            self._keep_rows(keep)

    def _decode_step(self) -> None:
        assert self._batch is not None and self._next is not None
        logits = self._batch.decode(self.model, self._next)
        self._counters.decode_steps += 1
        self._counters.decode_rows += len(self._rows)
        if self._settings is None:
            self._settings = self._row_settings(self._rows)
        keep, tokens = self._advance(self._rows, logits, self._settings)
        self._next = tokens
        if len(keep) < len(self._rows):
            self._keep_rows(keep)

    def _admit(self) -> None:
        room = self._max_batch_size - len(self._rows)
        take: list[_Sequence] = []
        budget = self._max_prefill_tokens
        while self._waiting and len(take) < room:
            n = len(self._waiting[0].prompt_ids) + len(self._waiting[0].completion)
            if take and n > budget:
                break
            take.append(self._waiting.popleft())
            budget -= n
        new_batch, logits = PaddedBatch.prefill(
            self.model, [s.prompt_ids + s.completion for s in take]
        )
        self._counters.prompt_tokens += sum(len(s.prompt_ids) for s in take if not s.completion)
        keep, tokens = self._advance(take, logits, self._row_settings(take))
        if not keep:
            return
        if len(keep) < len(take):
            index = torch.tensor(keep, device=tokens.device)
            new_batch.select(index)
            tokens = tokens.index_select(0, index)
            take = [take[i] for i in keep]
        if self._batch is None:
            running = new_batch if self._slots is None else self._slots.restart(new_batch)
            self._set_rows(take, running, tokens)
        else:
            assert self._next is not None
            self._batch.merge(new_batch)
            self._set_rows(self._rows + take, self._batch, torch.cat([self._next, tokens]))

    def _row_settings(self, rows: list[_Sequence]) -> RowSettings:
        return RowSettings.build(
            [s.params.temperature for s in rows],
            [s.params.top_p for s in rows],
            [s.generator for s in rows],
            max(s.params.top_logprobs for s in rows),
            self.model.device,
        )

    def _advance(
        self, rows: list[_Sequence], logits: torch.Tensor, settings: RowSettings
    ) -> tuple[list[int], torch.Tensor]:
        """Sample a token per row, hand out deltas and results; return the surviving rows."""
        drawn = sample(logits, settings, self._generator)
        tokens = drawn.tokens.tolist()
        logprobs = drawn.logprobs.tolist()
        top_ids = drawn.top_ids.tolist() if drawn.top_ids is not None else None
        top_lps = drawn.top_logprobs.tolist() if drawn.top_logprobs is not None else None
        version = self._version
        # Counted before any result is handed out, so a caller that got its result sees it counted.
        self._counters.tokens_generated += len(rows)
        keep: list[int] = []
        for i, seq in enumerate(rows):
            top = None
            if top_ids is not None and top_lps is not None and seq.params.top_logprobs:
                k = seq.params.top_logprobs
                top = [
                    TopLogprob(t, lp) for t, lp in zip(top_ids[i][:k], top_lps[i][:k], strict=True)
                ]
            reason = seq.advance(tokens[i], logprobs[i], top, version)
            if seq.deltas is not None:
                assert seq.text is not None
                text = seq.text.finish() if reason else seq.text.flush()
                delta = Delta(
                    token_ids=[tokens[i]],
                    logprobs=[logprobs[i]],
                    text=text,
                    top_logprobs=[top] if top is not None else None,
                )
                _post(seq.loop, seq.deltas.put_nowait, delta)
            if reason is None:
                keep.append(i)
            else:
                self._finish(seq, reason)
        return keep, drawn.tokens

    def _finish(self, seq: _Sequence, reason: FinishReason) -> None:
        result = seq.result(reason)
        self._counters.requests_finished += 1
        if seq.deltas is not None:
            _post(seq.loop, seq.deltas.put_nowait, result)
        _post(seq.loop, _resolve, seq.future, result)

    def _keep_rows(self, keep: list[int]) -> None:
        assert self._batch is not None and self._next is not None
        if not keep:
            self._set_rows([], None, None)
            return
        index = torch.tensor(keep, device=self._next.device)
        self._batch.select(index)
        self._set_rows(
            [self._rows[i] for i in keep], self._batch, self._next.index_select(0, index)
        )

    def _set_rows(
        self,
        rows: list[_Sequence],
        batch: PaddedBatch | SlotBatch | None,
        tokens: torch.Tensor | None,
    ) -> None:
        self._rows, self._batch, self._next = rows, batch, tokens
        self._settings = None

    def _fail_all(self, exc: Exception) -> None:
        for seq in [*self._rows, *self._waiting]:
            if seq.deltas is not None:
                _post(seq.loop, seq.deltas.put_nowait, exc)
            _post(seq.loop, _fail, seq.future, exc)
        for job in self._scores:
            _post(job.loop, _fail, job.future, exc)
        if self._swap is not None:
            _post(self._swap.loop, _fail, self._swap.future, exc)
        self._waiting.clear()
        self._scores = []
        self._swap = None
        self._set_rows([], None, None)
