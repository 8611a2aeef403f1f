"""Which attention the built-in engine runs: transformers' `sdpa` and, on a GPU, which
scaled-dot-product-attention backends torch may pick for it.

On CUDA torch may pick cuDNN attention for bf16 / fp16. Its kernels are fast but each call
costs about 1 ms of CPU: on an H200, 20 decode steps of SmolLM2's shape spent 626 ms of CPU in
600 `aten::_cudnn_attention_forward` calls while the GPU was busy 96 ms in all, and a bf16 step
fell from 106 ms to 35 ms with cuDNN's backend off (flash, memory-efficient and math each gave
25-30 ms). Decoding runs many small attention calls, so the engine allows every backend but
cuDNN there. On a CPU nothing changes: torch chooses as it always did.

torch keeps the backend flags that `torch.nn.attention.sdpa_kernel` sets in its global context:
they are process-wide, not per thread (setting them in one thread changes what every thread
sees). So `allowed_attention_backends` holds them for as long as any engine loop that asked for
them runs, counting holders under a lock, and puts back what it found when the last one leaves;
save-and-restore per forward pass from several engine threads would interleave and could leave
the flags changed for good.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def attention_implementation(device: torch.device | str) -> str | None:
    """transformers' `attn_implementation` to load the engine's model with: `sdpa` on CUDA (a
    checkpoint's config may name another), None elsewhere (transformers' default, today sdpa
    where the model supports it and eager otherwise)."""
    return "sdpa" if torch.device(device).type == "cuda" else None


def attention_backends(device: torch.device | str) -> list[SDPBackend] | None:
    """The SDPA backends the engine allows on `device`; None leaves torch's choice alone.

    CUDA: flash, memory-efficient and math, never cuDNN (its per-call CPU cost; cuDNN takes
    fp16 / bf16 only, so an fp32 model loses nothing). Any other device: None.
    """
    if torch.device(device).type != "cuda":
        return None
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class _ProcessWideBackends:
    """Reference-counted `sdpa_kernel`: entered by the first holder, left by the last one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._backends: list[SDPBackend] | None = None
        self._stack: ExitStack | None = None

    @contextmanager
    def hold(self, backends: list[SDPBackend] | None) -> Iterator[None]:
        if backends is None:
            yield
            return
        with self._lock:
            if self._holders == 0:
                stack = ExitStack()
                stack.enter_context(sdpa_kernel(backends))
                self._stack, self._backends = stack, list(backends)
            elif backends != self._backends:
                raise RuntimeError(
                    f"SDPA backends {backends} asked for while {self._backends} are held; "
                    "torch's flags are process-wide, so one process can hold one choice"
                )
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    assert self._stack is not None
                    stack, self._stack, self._backends = self._stack, None, None
                    stack.close()


_HELD = _ProcessWideBackends()


def allowed_attention_backends(backends: list[SDPBackend] | None) -> AbstractContextManager[None]:
    """Allow only `backends` (process-wide) while the context is open; None: no change."""
    return _HELD.hold(backends)
