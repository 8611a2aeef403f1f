"""Vectorised sampling for a batch whose rows have different settings.

Log-probs are those of the tempered distribution, log_softmax(logits / T), taken from the
very logits that sampled the token: what the trainer recomputes (before top-p truncation,
which only restricts which tokens can be drawn). Greedy rows (T = 0) report log_softmax(logits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowSettings:
    """Per-row sampling settings as tensors, rebuilt only when the batch's rows change."""

    temperature: torch.Tensor  # [B], 1.0 where greedy so the division is harmless
    greedy: torch.Tensor  # [B] bool
    top_p: torch.Tensor  # [B]
    any_top_p: bool
    all_greedy: bool
    generators: tuple[torch.Generator | None, ...]
    """Per-row generators for seeded requests; None rows share the engine's generator."""
    top_logprobs: int
    """Largest top-k asked for by any row (0: none)."""

    @classmethod
    def build(
        cls,
        temperatures: list[float],
        top_ps: list[float],
        generators: list[torch.Generator | None],
        top_logprobs: int,
        device: torch.device,
    ) -> RowSettings:
        temp = torch.tensor(temperatures, dtype=torch.float32, device=device)
        greedy = temp == 0
        top_p = torch.tensor(top_ps, dtype=torch.float32, device=device)
        return cls(
            temperature=torch.where(greedy, torch.ones_like(temp), temp),
            greedy=greedy,
            top_p=top_p,
            any_top_p=bool((top_p < 1).any()),
            all_greedy=bool(greedy.all()),
            generators=tuple(generators),
            top_logprobs=top_logprobs,
        )


@dataclass(frozen=True)
class Sampled:
    tokens: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32
    top_ids: torch.Tensor | None  # [B, k]
    top_logprobs: torch.Tensor | None  # [B, k]


def _gumbel_noise(
    shape: tuple[int, int], rows: RowSettings, shared: torch.Generator, device: torch.device
) -> torch.Tensor:
    """-log(-log(U)): argmax(logprobs + noise) draws from softmax(logprobs) (the Gumbel-max trick).

    Built from uniforms because torch's CPU `exponential_` is several times slower than `rand`.
    """
    uniform = torch.rand(shape, dtype=torch.float32, device=device, generator=shared)
    for i, gen in enumerate(rows.generators):
        if gen is not None:
            uniform[i] = torch.rand(shape[1], dtype=torch.float32, device=device, generator=gen)
    return uniform.log_().neg_().log_().neg_()


def _top_p_mask(logprobs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """True where a token lies outside the smallest set whose probability reaches top_p."""
    sorted_lp, order = logprobs.sort(dim=-1, descending=True)
    mass_before = sorted_lp.exp().cumsum(dim=-1) - sorted_lp.exp()
    drop_sorted = mass_before >= top_p[:, None]  # the first token always stays (mass_before = 0)
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def sample(logits: torch.Tensor, rows: RowSettings, shared: torch.Generator) -> Sampled:
    """Draw one token per row from `logits` [B, V]."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits / rows.temperature[:, None], dim=-1)
    if rows.all_greedy:
        tokens = logprobs.argmax(dim=-1)
    else:
        candidates = logprobs
        if rows.any_top_p:
            candidates = logprobs.masked_fill(_top_p_mask(logprobs, rows.top_p), float("-inf"))
        noise = _gumbel_noise((logprobs.shape[0], logprobs.shape[1]), rows, shared, logprobs.device)
        drawn = (candidates + noise).argmax(dim=-1)
        tokens = torch.where(rows.greedy, logprobs.argmax(dim=-1), drawn)
    chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    top_ids = top_lps = None
    if rows.top_logprobs:
        top_lps, top_ids = logprobs.topk(rows.top_logprobs, dim=-1)
    return Sampled(tokens=tokens, logprobs=chosen, top_ids=top_ids, top_logprobs=top_lps)
