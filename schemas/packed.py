"""Token ids and log-probs travel as packed little-endian bytes; numpy gives zero-copy views.

Packed arrays are smaller than msgpack lists of numbers and decode without making a Python
number per element (docs/benchmarks.md measures both), and the store turns the same bytes into
Array(UInt32)/Array(Float32).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec
import numpy as np

TOKEN_DTYPE = np.dtype("<u4")
LOGPROB_DTYPE = np.dtype("<f4")
MASK_DTYPE = np.dtype("u1")

# The `ch` extra names the ClickHouse column type, so the DDL follows from the field.
TokenIds = Annotated[bytes, msgspec.Meta(extra={"packed": TOKEN_DTYPE.str, "ch": "Array(UInt32)"})]
LogProbs = Annotated[
    bytes, msgspec.Meta(extra={"packed": LOGPROB_DTYPE.str, "ch": "Array(Float32)"})
]
Mask = Annotated[bytes, msgspec.Meta(extra={"packed": MASK_DTYPE.str, "ch": "Array(UInt8)"})]


def pack_tokens(ids: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(ids, dtype=TOKEN_DTYPE).tobytes()


def pack_logprobs(values: Sequence[float] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=LOGPROB_DTYPE).tobytes()


def pack_mask(values: Sequence[int] | Sequence[bool] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=MASK_DTYPE).tobytes()


def tokens(buf: bytes) -> np.ndarray:
    """A read-only uint32 view of packed token ids."""
    return np.frombuffer(buf, dtype=TOKEN_DTYPE)


def logprobs(buf: bytes) -> np.ndarray:
    """A read-only float32 view of packed log-probs."""
    return np.frombuffer(buf, dtype=LOGPROB_DTYPE)


def mask(buf: bytes) -> np.ndarray:
    return np.frombuffer(buf, dtype=MASK_DTYPE)
