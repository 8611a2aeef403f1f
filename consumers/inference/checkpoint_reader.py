"""Read safetensors checkpoints through fsspec and check them against a model before use.

A checkpoint is a single `.safetensors` file or a directory of them (Hugging Face layout,
sharded or not), at any fsspec URL (`file://`, `s3://`, `memory://`, a plain path...).
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import fsspec
import torch
from safetensors.torch import load as load_safetensors_bytes

from rlbus.bus.files import is_local
from rlbus.consumers.model_size import header_entries, read_bytes, read_header, safetensors_files
from rlbus.schemas.weights_file import FORMATS, KIND_KEY, WeightsKind


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the served model; the message says why."""


def checkpoint_files(uri: str) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    """The safetensors files a checkpoint URI names, in load order."""
    try:
        return safetensors_files(uri)
    except FileNotFoundError as exc:
        raise CheckpointError(str(exc)) from exc


@dataclass(frozen=True)
class Checkpoint:
    tensors: dict[str, torch.Tensor]
    kind: WeightsKind
    """Full weights or LoRA deltas over the base model (schemas/weights_file.py)."""


def _kind(header: bytes) -> str:
    """The kind a safetensors file's header names in `__metadata__`; files without rlbus's
    metadata, e.g. a Hugging Face model's, are full."""
    metadata = header_entries(header).get("__metadata__") or {}
    return metadata.get(KIND_KEY, "full")


def _one_kind(kinds: set[str], uri: str) -> WeightsKind:
    known: list[WeightsKind] = [kind for kind in FORMATS if kinds == {kind}]
    if not known:
        raise CheckpointError(
            f"checkpoint {uri} holds weights of kind {sorted(kinds)} ({KIND_KEY} metadata); "
            f"one kind of {sorted(FORMATS)} is read"
        )
    return known[0]


def tensor_names(fs: fsspec.AbstractFileSystem, files: list[str]) -> set[str]:
    """The tensor names checkpoint files hold, from their headers alone."""
    names: set[str] = set()
    for file in files:
        with fs.open(file, "rb") as f:
            names.update(k for k in header_entries(read_header(f)) if k != "__metadata__")
    return names


def weights_kind(uri: str) -> WeightsKind:
    """What a checkpoint holds, from its files' headers alone."""
    fs, files = checkpoint_files(uri)
    kinds = set()
    for file in files:
        with fs.open(file, "rb") as f:
            kinds.add(_kind(read_header(f)))
    return _one_kind(kinds, uri)


DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
"""safetensors' dtype names, as torch's."""


def map_safetensors(path: str) -> tuple[bytes, dict[str, torch.Tensor]]:
    """A local safetensors file's header and its tensors, as views of a private mapping of the
    file: pages load as the tensors are read, writes to them stay in this process, and the
    mapping goes with the last tensor. safetensors' own `load_file` (0.8.0) keeps some Python
    heap for every tensor it reads, for the life of the process
    (tests/inference/test_checkpoint_reader.py): on the path of every weight version served."""
    with open(path, "rb") as f:
        header = read_header(f)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    start = len(header)
    tensors: dict[str, torch.Tensor] = {}
    for name, entry in header_entries(header).items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in DTYPES:
            raise ValueError(f"tensor {name} has dtype {entry['dtype']}, which torch cannot read")
        dtype, shape = DTYPES[entry["dtype"]], entry["shape"]
        begin, end = entry["data_offsets"]
        count = math.prod(shape)
        if start + end > len(mapped) or end - begin != count * dtype.itemsize:
            raise ValueError(f"tensor {name} lies outside the file's {len(mapped)} bytes")
        if count == 0:  # a buffer view of no bytes is refused
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(mapped, dtype=dtype, count=count, offset=start + begin)
        tensors[name] = flat.view(shape)
    return header, tensors


def read_checkpoint(uri: str) -> Checkpoint:
    """Every tensor of the checkpoint, on CPU, and what kind of weights they are. Local files
    are mapped, not read: the tensors' pages load as they are copied into the model, with no
    copy of the whole file in memory first."""
    fs, files = checkpoint_files(uri)
    tensors: dict[str, torch.Tensor] = {}
    kinds: set[str] = set()
    for file in files:
        try:
            if is_local(fs):
                header, mapped = map_safetensors(file)
                kinds.add(_kind(header))
                tensors.update(mapped)
            else:
                with fs.open(file, "rb") as f:
                    raw = read_bytes(f)
                kinds.add(_kind(raw))
                tensors.update(load_safetensors_bytes(raw))
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise CheckpointError(f"cannot parse {file} from {uri}: {exc}") from exc
    return Checkpoint(tensors, _one_kind(kinds, uri))


def match_parameters(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor]
) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """Pair every model parameter with its checkpoint tensor, or fail naming what is wrong.

    Tied parameters (one tensor under several names, e.g. lm_head and embed_tokens) need one
    of their names in the checkpoint. A partial or mis-shaped checkpoint is refused whole,
    so the model never serves a mix of two versions.
    """
    names_of: dict[int, list[str]] = {}
    params: dict[int, torch.nn.Parameter] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), []).append(name)
        params[id(param)] = param
    known = {name for names in names_of.values() for name in names}
    unknown = sorted(set(tensors) - known)
    missing: list[str] = []
    misshaped: list[str] = []
    pairs: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    for key, names in names_of.items():
        found = next((n for n in names if n in tensors), None)
        if found is None:
            missing.append(names[0])
            continue
        tensor, param = tensors[found], params[key]
        if tuple(tensor.shape) != tuple(param.shape):
            misshaped.append(
                f"{found}: checkpoint {tuple(tensor.shape)} vs model {tuple(param.shape)}"
            )
            continue
        pairs.append((param, tensor))
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} parameters (first: {missing[:3]})")
    if unknown:
        problems.append(f"{len(unknown)} names the model does not have (first: {unknown[:3]})")
    if misshaped:
        problems.append(f"shape mismatches: {misshaped[:3]}")
    if problems:
        raise CheckpointError("checkpoint does not fit the served model: " + "; ".join(problems))
    return pairs
