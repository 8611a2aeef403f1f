"""What a model takes, known before a weight of it is read: its sizes from the directory's
config.json (the Llama shape: Llama, Mistral, Qwen2/3, SmolLM), else from its safetensors
files' headers; and how much memory a device has free. The trainer's and inference's memory
estimates (consumers/trainer/memory.py, consumers/inference/sizing.py) and `rlbus run`'s
check of both together start from these, so that a model that cannot fit is refused before
it is loaded.

The safetensors header reading lives here (torch-free) and consumers/inference/checkpoint_reader.py
uses it to read weight versions.
"""

from __future__ import annotations

import json
import logging
import math
import posixpath
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

LOADING = threading.Lock()
"""One model load at a time in a process: transformers' `from_pretrained` switches process-wide
state while it builds a model (its weights first made on the meta device), so two loads on two
threads at once (the trainer's and inference's, run in one process by the in-process runner)
could leave one of them with meta tensors ("Cannot copy out of meta tensor")."""

log = logging.getLogger(__name__)

RUNTIME_BYTES = 1 << 30
"""torch, transformers and the process itself, in a role that holds a model."""

LLAMA_LIKE = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3"})
"""Decoders of the Llama shape (q/k/v/o attention, gated MLP, RMSNorms), counted from config.json;
others are counted from their safetensors headers."""
TIED_BY_DEFAULT = frozenset({"smollm3"})
"""Model types whose config ties the output head to the embeddings when it does not say."""


class NotEnoughMemory(RuntimeError):
    """A model would not fit in the memory available; the message gives the estimate and the
    setting to change."""


def gb(n: float) -> str:
    """Bytes for a person: GB, or MB below a tenth of one."""
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


@dataclass(frozen=True)
class Linear:
    """Linear layers of one name (q_proj, or a full module path read from a header)."""

    name: str
    inputs: int
    outputs: int
    count: int
    """How many the model has (one a layer)."""


@dataclass(frozen=True)
class ModelSize:
    params: int
    """Parameters, a tied head counted once."""
    layers: int
    hidden: int
    vocab: int
    kv_width: int
    """Key (or value) elements a layer caches per token: KV heads x head dim; 0 when unknown."""
    linears: tuple[Linear, ...]
    """The linear layers LoRA adapts with target_modules = "all-linear" (the output head left
    out, as peft does)."""
    source: str
    """Where the sizes come from: config.json or the safetensors headers."""

    @property
    def kv_per_token(self) -> int:
        """Elements of KV cache one token takes: keys and values of every layer."""
        return 2 * self.layers * self.kv_width

    def adapter_params(self, rank: int, target_modules: str) -> int:
        """Parameters of LoRA adapters of `rank` on `target_modules` ("all-linear" or names,
        comma-separated, matched as peft matches them: the module's name or its last part)."""
        targets = None if target_modules == "all-linear" else target_modules.split(",")
        return sum(
            rank * (linear.inputs + linear.outputs) * linear.count
            for linear in self.linears
            if targets is None
            or any(linear.name == t or linear.name.endswith("." + t) for t in targets)
        )


def _sizes(config: dict[str, Any]) -> dict[str, Any]:
    """The table holding the decoder's sizes (a multimodal config keeps them in text_config)."""
    text = config.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in config:
        return {**text, "model_type": text.get("model_type", config.get("model_type"))}
    return config


def _llama_like(c: dict[str, Any]) -> ModelSize | None:
    """Counted from the sizes, as transformers builds the model; None when one is missing."""
    try:
        hidden, layers = int(c["hidden_size"]), int(c["num_hidden_layers"])
        inter, vocab = int(c["intermediate_size"]), int(c["vocab_size"])
        heads = int(c["num_attention_heads"])
        head_dim = int(c.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    kind = c.get("model_type")
    q, kv = heads * head_dim, int(c.get("num_key_value_heads") or heads) * head_dim
    linears = (
        Linear("q_proj", hidden, q, layers),
        Linear("k_proj", hidden, kv, layers),
        Linear("v_proj", hidden, kv, layers),
        Linear("o_proj", q, hidden, layers),
        Linear("gate_proj", hidden, inter, layers),
        Linear("up_proj", hidden, inter, layers),
        Linear("down_proj", inter, hidden, layers),
    )
    params = sum(x.inputs * x.outputs * x.count for x in linears)
    if kind == "qwen2":  # q, k and v always carry biases
        params += layers * (q + 2 * kv)
    elif c.get("attention_bias"):
        params += layers * (q + 2 * kv + hidden)
    if c.get("mlp_bias"):
        params += layers * (2 * inter + hidden)
    params += layers * 2 * hidden + hidden  # the norms around each layer, and the final one
    if kind == "qwen3":
        params += layers * 2 * head_dim  # q_norm, k_norm
    tied = c.get("tie_word_embeddings", kind in TIED_BY_DEFAULT)
    params += vocab * hidden * (1 if tied else 2)
    return ModelSize(params, layers, hidden, vocab, kv, linears, "config.json")


def _from_headers(path: str, c: dict[str, Any]) -> ModelSize | None:
    """Counted from the tensors' shapes; the other sizes from the config where it has them."""
    try:
        shapes = tensor_shapes(path)
    except (FileNotFoundError, ValueError, OSError) as exc:
        log.info("no size for %s from its safetensors headers: %s", path, exc)
        return None
    params = sum(math.prod(shape) for shape in shapes.values())
    linears = tuple(
        Linear(name.removesuffix(".weight"), shape[1], shape[0], 1)
        for name, shape in shapes.items()
        if len(shape) == 2
        and name.endswith(".weight")
        and "embed" not in name
        and not name.startswith(("lm_head", "output."))
    )

    def size(*keys: str) -> int:
        value = next((c[k] for k in keys if isinstance(c.get(k), int)), 0)
        return int(value)

    hidden, heads = size("hidden_size", "n_embd", "d_model"), size("num_attention_heads", "n_head")
    head_dim = size("head_dim") or (hidden // heads if heads else 0)
    kv = (size("num_key_value_heads") or heads) * head_dim
    layers = size("num_hidden_layers", "n_layer")
    return ModelSize(params, layers, hidden, size("vocab_size"), kv, linears, "safetensors headers")


def model_size(path: str | Path) -> ModelSize | None:
    """The sizes of the model in directory `path`, without loading it: from config.json for the
    Llama shape, else from its safetensors headers; None when neither tells (no estimate is
    made, and the model loads as it would have)."""
    config_path = Path(path) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        log.info("no memory estimate for %s: %s", path, exc)
        return None
    sizes = _sizes(config)
    if sizes.get("model_type") in LLAMA_LIKE and (found := _llama_like(sizes)) is not None:
        return found
    return _from_headers(str(path), sizes)


def available_bytes(device: str) -> int | None:
    """Free memory of the device (CUDA) or MemAvailable of the host; None when unknown."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info(torch.device(device))
            return free
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


# ---- safetensors files and their headers -----------------------------------------------------


def safetensors_files(uri: str) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    """The safetensors files a checkpoint URI names (a file, or a Hugging Face directory,
    sharded or not), in load order; FileNotFoundError when there are none."""
    fs, path = fsspec.core.url_to_fs(uri)
    if not fs.exists(path):
        raise FileNotFoundError(f"checkpoint {uri} does not exist")
    if not fs.isdir(path):
        return fs, [path]
    index = posixpath.join(path, "model.safetensors.index.json")
    if fs.exists(index):
        with fs.open(index, "rb") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return fs, [posixpath.join(path, name) for name in shards]
    files = sorted(p for p in fs.ls(path, detail=False) if p.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint directory {uri} holds no .safetensors files")
    return fs, files


def read_bytes(f: Any, size: int = -1) -> bytes:
    """Bytes from an fsspec file opened "rb" (its annotations allow text as well)."""
    data = f.read(size)
    assert isinstance(data, bytes), "checkpoint files are opened 'rb'"
    return data


def read_header(f: Any) -> bytes:
    """A safetensors file's 8-byte header length and its JSON header, read from its start."""
    length = read_bytes(f, 8)
    return length + read_bytes(f, int.from_bytes(length, "little"))


def header_entries(header: bytes) -> dict[str, Any]:
    """A safetensors file's header (8-byte little-endian length, then JSON): its tensors by
    name, and `__metadata__`."""
    length = int.from_bytes(header[:8], "little")
    return json.loads(header[8 : 8 + length])


def tensor_shapes(uri: str) -> dict[str, list[int]]:
    """Every tensor's shape, by name, from the checkpoint's headers alone."""
    fs, files = safetensors_files(uri)
    shapes: dict[str, list[int]] = {}
    for file in files:
        with fs.open(file, "rb") as f:
            entries = header_entries(read_header(f))
        shapes.update({k: list(v["shape"]) for k, v in entries.items() if k != "__metadata__"})
    return shapes
