"""Token records of random tokens and log-probs, for tests and benchmarks of the store path."""

from __future__ import annotations

import numpy as np

from rlbus.schemas import TokenRecord, derived_id
from rlbus.schemas.packed import pack_logprobs, pack_tokens


def token_records(n: int, tokens: int, run_id: str, start: int = 0) -> list[TokenRecord]:
    """`n` records of `tokens` completion tokens, their rollouts numbered from `start` (so
    that separate calls make distinct ids)."""
    rng = np.random.default_rng(start)
    ids = rng.integers(0, 32_000, (n, tokens), dtype=np.uint32)
    lps = -rng.random((n, tokens), dtype=np.float32)
    return [
        TokenRecord(
            rollout_id=derived_id("r", start + i),
            call_index=0,
            run_id=run_id,
            prompt_ids=pack_tokens(ids[i, :8]),
            completion_ids=pack_tokens(ids[i]),
            logprobs=pack_logprobs(lps[i]),
            policy_version=1,
        )
        for i in range(n)
    ]
