"""`rlbus model export run:RUN_ID@VERSION OUT --base DIR`: a stored weight version of a run as a
Hugging Face directory that `from_pretrained(OUT)` loads.

The version is found in the store: the sink keeps every WeightVersion in `weight_versions`
(its file's URI and format), read-only, through the holder's endpoint while a run holds a chdb
store. `@latest` is the newest stored. The store does not record the model a run started from
(its config's `model`), so `--base` names it: its config, generation config and tokenizer files
become OUT's, and its weights are what a LoRA-delta version is merged onto.

The version is applied to the base as the built-in engine applies one when it serves it
(`read_checkpoint`; `match_parameters` for full weights, `AdapterMerger` for LoRA deltas), in
float32 as the engine computes, then written with `save_pretrained` in `dtype`: parameter names
as `from_pretrained` expects them, tied embeddings stored once and loaded tied. OUT is written in
a temporary sibling and renamed at the end: a failure leaves it as it was. torch and
transformers are imported inside the functions that use them.
"""

from __future__ import annotations

import posixpath
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlbus.bus.store import Store, open_store
from rlbus.bus.store.reads.model_export import RUN_VERSIONS, RUNS_WITH_VERSIONS
from rlbus.config.secret import SecretUrl
from rlbus.config.version_ref import VersionRef, VersionRefError
from rlbus.consumers.inference.model_import import Dtype, staged_dir
from rlbus.schemas.weights_file import FORMATS, WeightsKind

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from rlbus.consumers.inference.checkpoint_reader import Checkpoint

WEIGHT_FILES = (
    "*.safetensors",
    "*.safetensors.index.json",
    "*.bin",
    "*.bin.index.json",
    "*.pt",
    "*.pth",
    "*.gguf",
)
"""Base files that are weights, never copied: OUT's are the version's."""
WRITTEN = ("config.json", "generation_config.json")
"""Files `save_pretrained` writes from the base's own (config.json's dtype the written one)."""


class ModelExportError(Exception):
    """A version that cannot be exported as asked; the message says what is wrong."""


@dataclass(frozen=True)
class StoredVersion:
    """A WeightVersion as the store holds it."""

    run_id: str
    version: int
    uri: str
    format: str
    num_params: int
    """Parameters of the trainer's model, adapters included (0: not said)."""

    def __str__(self) -> str:
        return f"version {self.version} of run {self.run_id!r}"


@dataclass(frozen=True)
class ModelExport:
    version: StoredVersion
    kind: WeightsKind
    base: Path
    out: Path
    architecture: str
    parameters: int
    """Distinct parameters (tied embeddings count once)."""
    tied: bool
    dtype: Dtype
    bytes_on_disk: int
    seconds: float


def version_spans(versions: list[int]) -> str:
    """Sorted version numbers in short form: `0-4, 7, 9-12`."""
    parts: list[str] = []
    start = prev = None
    for v in [*versions, None]:
        if start is not None and prev is not None and v == prev + 1:
            prev = v
            continue
        if start is not None and prev is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = v
    return ", ".join(parts) or "none"


def find_version(
    store: Store, ref: VersionRef, store_url: str
) -> tuple[StoredVersion, list[StoredVersion]]:
    """The stored WeightVersion `ref` names and every stored version of its run, or an error
    listing the runs (an unknown run) or the run's versions (a version it does not have)."""
    rows = store.query(RUN_VERSIONS, {"run": ref.run_id}).rows
    if not rows:
        runs = [str(r[0]) for r in store.query(RUNS_WITH_VERSIONS).rows]
        shown = ", ".join(runs[:20]) + (f" and {len(runs) - 20} more" if len(runs) > 20 else "")
        raise ModelExportError(
            f"no run {ref.run_id!r} with weight versions in {SecretUrl(store_url)} "
            f"(runs with some: {shown or 'none'})"
        )
    versions = [StoredVersion(ref.run_id, int(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows]
    wanted = versions[-1].version if ref.version is None else ref.version
    found = next((v for v in versions if v.version == wanted), None)
    if found is None:
        raise ModelExportError(
            f"run {ref.run_id!r} has no weight version {wanted} in the store; its versions: "
            f"{version_spans([v.version for v in versions])}"
        )
    return found, versions


def check_weights_file(found: StoredVersion, others: list[StoredVersion]) -> None:
    """Refuse a version whose file the trainer has pruned (or that was moved), naming the
    versions whose files remain in its folder."""
    import fsspec

    if found.format not in FORMATS.values():
        raise ModelExportError(
            f"{found} at {found.uri} is {found.format!r}; one of {sorted(FORMATS.values())} "
            "is exported"
        )
    fs, path = fsspec.core.url_to_fs(found.uri)
    if fs.exists(path):
        return
    folder = posixpath.dirname(path)
    present = set(fs.ls(folder, detail=False)) if fs.isdir(folder) else set()
    kept = [o.version for o in others if fsspec.core.url_to_fs(o.uri)[1] in present]
    raise ModelExportError(
        f"the weights file of {found} is gone: {found.uri} (a trainer keeps the newest "
        f"trainer.keep_weights files of a run, 3 by default); versions whose files remain: "
        f"{version_spans(kept)}"
    )


def check_base(base: Path | None) -> Path:
    if base is None:
        raise ModelExportError(
            "--base is missing: the store does not record the model a run started from; pass "
            "--base DIR, the Hugging Face directory of the run's `model` (its config and "
            "tokenizer are copied, and a LoRA version is merged onto its weights)"
        )
    base = base.expanduser()
    if not (base / "config.json").is_file():
        raise ModelExportError(
            f"--base {base} is not a Hugging Face model directory (no config.json); pass the "
            "directory of the run's `model`"
        )
    return base


def check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ModelExportError(f"OUT {out} is a file; name a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ModelExportError(f"OUT {out} exists and is not empty; pass --force to replace it")


def apply_version(found: StoredVersion, base: Path) -> tuple[PreTrainedModel, WeightsKind]:
    """The base model with `found`'s weights, as the engine serves that version."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlbus.consumers.inference.adapters import AdapterMerger
    from rlbus.consumers.inference.checkpoint_reader import (
        CheckpointError,
        match_parameters,
        read_checkpoint,
    )

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    try:
        checkpoint = read_checkpoint(found.uri)
        if checkpoint.kind == "lora-delta":
            pairs = AdapterMerger(model).pairs(checkpoint.tensors, found.version)
        else:
            pairs = match_parameters(model, checkpoint.tensors)
    except CheckpointError as exc:
        raise ModelExportError(
            f"{found} does not fit the base {base}: {exc}. --base is the model the run started "
            "from (its config's `model`)"
        ) from exc
    check_parameter_count(found, base, model, checkpoint)
    with torch.no_grad():
        for param, tensor in pairs:
            param.copy_(tensor.to(dtype=param.dtype))
    return model, checkpoint.kind


def check_parameter_count(
    found: StoredVersion, base: Path, model: PreTrainedModel, checkpoint: Checkpoint
) -> None:
    """LoRA deltas fit any model with layers of their names and sizes (a llama's q/k/v/o and MLP
    deltas fit a qwen3 of the same sizes); the trainer's model had the base's parameters plus
    the adapters, which tells most other bases apart. (Full weights need no count: they replace
    every parameter, names and shapes checked, and a LoRA run publishing merged weights counts
    adapters its files do not hold.) A base of the run's architecture and sizes but other
    weights cannot be told apart: the store does not record which model a run started from."""
    if checkpoint.kind != "lora-delta" or not found.num_params:
        return
    expected = sum(p.numel() for p in model.parameters()) + sum(
        t.numel() for t in checkpoint.tensors.values()
    )
    if expected != found.num_params:
        raise ModelExportError(
            f"{found} does not fit the base {base}: the run's model had {found.num_params:,} "
            f"parameters with its adapters, this base with them has {expected:,}. --base is the "
            "model the run started from (its config's `model`)"
        )


def copy_base_files(base: Path, out: Path) -> None:
    """The base's files but its weights and what save_pretrained writes: tokenizer, chat
    template, and whatever else lies beside them (a README, a licence)."""
    skipped = {p for pattern in WEIGHT_FILES for p in base.glob(pattern)}
    for path in sorted(base.iterdir()):
        if path.is_file() and path not in skipped and not path.name.startswith("."):
            if path.name not in WRITTEN:
                shutil.copy2(path, out / path.name)


def export_version(
    store_url: str,
    ref: str | VersionRef,
    out: str | Path,
    base: Path | None,
    dtype: Dtype = "float32",
    force: bool = False,
) -> ModelExport:
    """Write the stored version `ref` names to `out` as a Hugging Face directory in `dtype`."""
    import torch

    start = time.monotonic()
    try:
        ref = VersionRef.parse(ref) if isinstance(ref, str) else ref
    except VersionRefError as exc:
        raise ModelExportError(str(exc)) from None
    out = Path(out).expanduser()
    base = check_base(base)
    check_out(out, force)
    with open_store(store_url, read_only=True) as store:
        found, others = find_version(store, ref, store_url)
    check_weights_file(found, others)
    model, kind = apply_version(found, base)
    model = model.to(getattr(torch, dtype))
    with staged_dir(out) as staging:
        copy_base_files(base, staging)
        model.save_pretrained(staging)
    config = model.config.get_text_config()
    return ModelExport(
        version=found,
        kind=kind,
        base=base,
        out=out,
        architecture=type(model).__name__,
        parameters=sum(p.numel() for p in model.parameters()),
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        dtype=dtype,
        bytes_on_disk=sum(f.stat().st_size for f in out.rglob("*") if f.is_file()),
        seconds=time.monotonic() - start,
    )
