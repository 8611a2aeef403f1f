"""Trainer checkpoints and published weights, at any fsspec URL, written atomically.

    <base>/weights/v000012.safetensors   what WeightVersion 12 points at (full, merged weights)
    <base>/state/step-000012/state.pt    model + optimizer + scheduler + RNG
    <base>/state/step-000012/meta.json   step, version, ids of every batch trained so far
    <base>/latest.json                   {"step": 12, "state": "state/step-000012"}

Every file is written under a temporary name and renamed, and latest.json is renamed last:
a crash at any point leaves the previous checkpoint whole and named by latest.json.
"""

from __future__ import annotations

import io
import json
import posixpath
import uuid
from dataclasses import dataclass, field

import fsspec
import torch
from safetensors.torch import save as safetensors_bytes

LATEST = "latest.json"


class NothingToResume(RuntimeError):
    """--resume found no checkpoint."""


@dataclass
class TrainerState:
    step: int = 0
    """Optimizer steps taken; also the version of the weights they produced."""
    batch_ids: list[str] = field(default_factory=list)
    """Every batch trained, in order: a redelivered one is skipped."""


def absolute(url: str) -> str:
    """Relative local paths resolve now, so every process agrees on the same files."""
    import os

    if "://" not in url:
        return "file://" + os.path.abspath(url)
    if url.startswith("file://") and not url.startswith("file:///"):
        return "file://" + os.path.abspath(url[len("file://") :])
    return url


class CheckpointStore:
    def __init__(self, url: str, keep_states: int = 2, keep_weights: int = 8):
        self.url = absolute(url).rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.keep_states = keep_states
        self.keep_weights = keep_weights

    def _write(self, rel: str, data: bytes) -> str:
        path = posixpath.join(self.root, rel)
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, path)
        return path

    def _read(self, rel: str) -> bytes:
        with self.fs.open(posixpath.join(self.root, rel), "rb") as f:
            return f.read()

    def weights_uri(self, version: int) -> str:
        return f"{self.url}/weights/v{version:06d}.safetensors"

    def has_weights(self, version: int) -> bool:
        return self.fs.exists(posixpath.join(self.root, f"weights/v{version:06d}.safetensors"))

    def write_weights(self, version: int, tensors: dict[str, torch.Tensor]) -> str:
        """Write a weight version; returns its URI for WeightVersion."""
        self._write(f"weights/v{version:06d}.safetensors", safetensors_bytes(tensors))
        self._prune("weights", self.keep_weights)
        return self.weights_uri(version)

    def save(self, state: TrainerState, tensors: dict) -> None:
        """Save model/optimizer tensors and the trainer state, then point latest.json at them."""
        rel = f"state/step-{state.step:06d}"
        buf = io.BytesIO()
        torch.save(tensors, buf)
        self._write(f"{rel}/state.pt", buf.getvalue())
        self._write(
            f"{rel}/meta.json",
            json.dumps({"step": state.step, "batch_ids": state.batch_ids}).encode(),
        )
        self._write(LATEST, json.dumps({"step": state.step, "state": rel}).encode())
        self._prune("state", self.keep_states)

    def exists(self) -> bool:
        return self.fs.exists(posixpath.join(self.root, LATEST))

    def load(self) -> tuple[TrainerState, dict]:
        if not self.exists():
            raise NothingToResume(f"nothing to resume: no {LATEST} under {self.url}")
        rel = json.loads(self._read(LATEST))["state"]
        meta = json.loads(self._read(f"{rel}/meta.json"))
        tensors = torch.load(io.BytesIO(self._read(f"{rel}/state.pt")), weights_only=False)
        return TrainerState(meta["step"], meta["batch_ids"]), tensors

    def latest_step(self) -> int | None:
        return json.loads(self._read(LATEST))["step"] if self.exists() else None

    def _prune(self, folder: str, keep: int) -> None:
        base = posixpath.join(self.root, folder)
        entries = sorted(p for p in self.fs.ls(base, detail=False) if not p.endswith(".tmp"))
        for old in entries[:-keep]:
            self.fs.rm(old, recursive=True)
