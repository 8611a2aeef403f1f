"""Trainer checkpoints and published weights, at any fsspec URL, written atomically.

    <base>/weights/v000012.safetensors   what WeightVersion 12 points at, in trainer.weights_dtype:
                                         full weights (LoRA merged, a tied head left out) or
                                         LoRA deltas alone (schemas/weights_file.py)
    <base>/state/step-000012/state.pt    trained weights + optimizer + scheduler (every
                                         checkpoint_every); under LoRA the adapters alone and
                                         a digest of the frozen base (session.py)
    <base>/state/step-000012/meta.json   step, version, ids of every batch trained so far
    <base>/latest.json                   {"step": 12, "state": "state/step-000012"}

Every file is written under a temporary name and renamed, and latest.json is renamed last:
a crash at any point leaves the previous checkpoint whole and named by latest.json.
"""

from __future__ import annotations

import io
import json
import posixpath
import time
from dataclasses import dataclass, field

import torch
from safetensors.torch import save_file as save_safetensors

from rlbus.bus.files import Folder
from rlbus.schemas.weights_file import FORMATS, KIND_KEY, WeightsKind

LATEST = "latest.json"


class NothingToResume(RuntimeError):
    """--resume found no checkpoint."""


class NonFiniteWeights(RuntimeError):
    """Weights with NaN or infinite values, which no checkpoint may hold."""


@dataclass
class TrainerState:
    step: int = 0
    """Optimizer steps taken; also the version of the weights they produced."""
    batch_ids: list[str] = field(default_factory=list)
    """Every batch trained, in order: a redelivered one is skipped."""


@dataclass(frozen=True)
class WrittenWeights:
    uri: str
    bytes: int
    seconds: float
    """Casting, serialising and writing."""


def _finite(t: torch.Tensor) -> bool:
    """No NaN or infinity in `t`, in one reading pass: any of them makes the sum non-finite
    (finite weights cannot sum past float32's range, in which it is summed), where
    isfinite().all() first allocates a mask of the tensor's size."""
    return not t.is_floating_point() or bool(torch.isfinite(t.sum(dtype=torch.float32)))


class CheckpointStore:
    def __init__(
        self,
        url: str,
        keep_states: int = 2,
        keep_weights: int = 3,
        weights_dtype: torch.dtype | None = None,
        weights_kind: WeightsKind = "full",
    ):
        self.folder = Folder(url)
        self.url = self.folder.url
        self.keep_states = keep_states
        self.keep_weights = keep_weights
        self.weights_dtype = weights_dtype
        """Floating tensors are written in this dtype (None: as they are)."""
        self.weights_kind: WeightsKind = weights_kind
        """What the hooks hand `write_weights`: full weights or LoRA deltas."""

    @property
    def weights_format(self) -> str:
        """`WeightVersion.format` of the files this store writes."""
        return FORMATS[self.weights_kind]

    def weights_uri(self, version: int) -> str:
        return self.folder.uri(f"weights/v{version:06d}.safetensors")

    def has_weights(self, version: int) -> bool:
        return self.folder.exists(f"weights/v{version:06d}.safetensors")

    def write_weights(self, version: int, tensors: dict[str, torch.Tensor]) -> WrittenWeights:
        """Write a weight version (tied duplicates already left out: safetensors refuses tensors
        sharing memory). Weights with a NaN or an infinity are refused: inference must never
        load them."""
        started = time.perf_counter()
        if self.weights_dtype is not None:
            tensors = {
                k: t.to(self.weights_dtype) if t.is_floating_point() else t
                for k, t in tensors.items()
            }
        # Checked as written: half the bytes to read for bf16, and a float32 value past bf16's
        # largest, which the cast made infinite, is caught too.
        broken = [name for name, t in tensors.items() if not _finite(t)]
        if broken:
            raise NonFiniteWeights(
                f"weights of version {version} hold non-finite values in {broken[:5]} "
                f"({len(broken)} tensors); not written"
            )
        name = f"v{version:06d}.safetensors"
        size = self.folder.write_file(
            f"weights/{name}",
            lambda path: save_safetensors(tensors, path, metadata={KIND_KEY: self.weights_kind}),
        )
        self._prune("weights", self.keep_weights, newest=name)
        return WrittenWeights(self.weights_uri(version), size, time.perf_counter() - started)

    def save(self, state: TrainerState, tensors: dict) -> None:
        """Save model/optimizer tensors and the trainer state, then point latest.json at them."""
        rel = f"state/step-{state.step:06d}"
        self.folder.write_file(f"{rel}/state.pt", lambda path: torch.save(tensors, path))
        self.folder.write(
            f"{rel}/meta.json",
            json.dumps({"step": state.step, "batch_ids": state.batch_ids}).encode(),
        )
        self.folder.write(LATEST, json.dumps({"step": state.step, "state": rel}).encode())
        self._prune("state", self.keep_states)

    def exists(self) -> bool:
        return self.folder.exists(LATEST)

    def load(self) -> tuple[TrainerState, dict]:
        if not self.exists():
            raise NothingToResume(f"nothing to resume: no {LATEST} under {self.url}")
        rel = json.loads(self.folder.read(LATEST))["state"]
        meta = json.loads(self.folder.read(f"{rel}/meta.json"))
        tensors = torch.load(io.BytesIO(self.folder.read(f"{rel}/state.pt")), weights_only=False)
        return TrainerState(meta["step"], meta["batch_ids"]), tensors

    def latest_step(self) -> int | None:
        return json.loads(self.folder.read(LATEST))["step"] if self.exists() else None

    def _prune(self, folder: str, keep: int, newest: str | None = None) -> None:
        """Keep the `keep` newest entries of `folder`. Entries after `newest` (just written)
        go first: a trainer resumed from an older state writes versions again that a run it
        replaces had got past, and those later versions are trained again."""
        fs, base = self.folder.fs, self.folder.path(folder)
        entries = sorted(p for p in fs.ls(base, detail=False) if not p.endswith(".tmp"))
        stale = [p for p in entries if newest is not None and posixpath.basename(p) > newest]
        kept = [p for p in entries if p not in stale]
        for old in [*stale, *kept[:-keep]]:
            fs.rm(old, recursive=True)
