"""The token strip of a rollout: each branch's tokens as the trainer would see them (the same
trace -> samples contract as the orchestrator: ids, loss mask, inference log-probs), with the
policy version that sampled each token, decoded with the run's tokenizer when one is found."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from rlbus.schemas import TokenRecord, TraceNode
from rlbus.schemas.packed import logprobs as unpack_logprobs
from rlbus.schemas.packed import mask as unpack_mask
from rlbus.schemas.packed import tokens as unpack_tokens
from rlbus.schemas.samples import TraceError, branch_paths, trace_samples

log = logging.getLogger(__name__)

BUCKETS = 10
"""Colour steps of a sampled token's probability, exp(log-prob): bucket i holds [i/10, (i+1)/10)."""


@dataclass(frozen=True)
class Token:
    id: int
    text: str
    logprob: float | None
    """None for context tokens (nothing was sampled)."""
    mask: int
    """The loss-mask value (rlbus.schemas.masks): 0 context, 1 policy, 2 supervised."""
    version: int | None

    @property
    def bucket(self) -> int | None:
        if self.logprob is None:
            return None
        return min(BUCKETS - 1, max(0, int(math.exp(self.logprob) * BUCKETS)))


@dataclass(frozen=True)
class Strip:
    label: str
    tokens: list[Token]
    decoded: bool
    """Token texts come from a tokenizer (else they are the ids)."""
    note: str = ""


class Decoder:
    """Token ids -> text with a Hugging Face fast tokenizer (`tokenizer.json`, in a directory
    or named directly): the one given, else the run's model when its name is such a directory.
    Without one, ids are shown as numbers."""

    def __init__(self, tokenizer: str | None):
        self.tokenizer = tokenizer

    def for_model(self, model: str) -> Tokenizer | None:
        return _load(self.tokenizer or model)

    def found(self, model: str) -> bool:
        return self.for_model(model) is not None

    def texts(self, ids: np.ndarray, model: str) -> list[str]:
        tokenizer = self.for_model(model)
        if tokenizer is None:
            return [str(i) for i in ids.tolist()]
        return [tokenizer.decode([i], skip_special_tokens=False) for i in ids.tolist()]


@lru_cache(maxsize=8)
def _load(name: str) -> Tokenizer | None:
    path = Path(name) if name else None
    if path is not None and path.is_dir():
        path = path / "tokenizer.json"
    if path is None or not path.is_file():
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # an unreadable file means: show ids, and say why in the log
        log.warning("cannot read tokenizer %s (%s): showing token ids", path, exc)
        return None


def strips(
    nodes: list[TraceNode], records: list[TokenRecord], decode: Decoder, model: str
) -> list[Strip]:
    """One strip per branch from the trace; without a trace (or one that does not hold
    together), one per model call from its token record."""
    if nodes:
        try:
            return _branch_strips(nodes, records, decode, model)
        except TraceError as exc:
            note = f"the trace does not hold together ({exc}); showing each call's tokens"
            return _call_strips(records, decode, model, note)
    return _call_strips(records, decode, model)


def _branch_strips(
    nodes: list[TraceNode], records: list[TokenRecord], decode: Decoder, model: str
) -> list[Strip]:
    by_call = {r.call_index: r for r in records}
    out = []
    paths = branch_paths(nodes)
    for (branch, path), sample in zip(paths.items(), trace_samples(nodes, records), strict=True):
        ids = unpack_tokens(sample.input_ids)
        loss = unpack_mask(sample.loss_mask)
        lps = unpack_logprobs(sample.inference_logprobs)
        versions: list[int | None] = []
        for node in path:
            record = by_call.get(node.call_index) if node.sampled else None
            versions += [record.policy_version if record else None] * len(
                unpack_tokens(node.token_ids)
            )
        texts = decode.texts(ids, model)
        tokens = [
            Token(int(i), t, float(lp) if m else None, int(m), v)
            for i, t, lp, m, v in zip(ids, texts, lps, loss, versions, strict=True)
        ]
        out.append(Strip(f"branch {branch}", tokens, decode.found(model)))
    return out


def _call_strips(
    records: list[TokenRecord], decode: Decoder, model: str, note: str = ""
) -> list[Strip]:
    out = []
    for r in sorted(records, key=lambda r: r.call_index):
        prompt, completion = unpack_tokens(r.prompt_ids), unpack_tokens(r.completion_ids)
        lps = unpack_logprobs(r.logprobs)
        if len(lps) != len(completion):
            lps = np.full(len(completion), np.nan, dtype=np.float32)
        texts = decode.texts(np.concatenate([prompt, completion]), model)
        context = [Token(int(i), t, None, 0, None) for i, t in zip(prompt, texts, strict=False)]
        sampled = [
            Token(int(i), t, None if np.isnan(lp) else float(lp), 1, r.policy_version)
            for i, t, lp in zip(completion, texts[len(prompt) :], lps, strict=True)
        ]
        out.append(Strip(f"call {r.call_index}", context + sampled, decode.found(model), note))
    return out
