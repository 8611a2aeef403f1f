"""`rlbus model init`: a randomly initialised Hugging Face model directory, built from a config.

Nothing is downloaded: the architecture comes from a transformers config class and the
tokenizer is the local byte-level one. The directory loads with plain
`AutoModelForCausalLM.from_pretrained(path)` / `AutoTokenizer.from_pretrained(path)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, Qwen3Config

from rlbus.consumers.inference.api import Arch, Size, TokenizerKind
from rlbus.consumers.inference.byte_tokenizer import build_byte_tokenizer

# tiny: ~0.9M parameters, fast enough on 2 CPU cores for tests and the RL smoke runs
# (bench/inference.py measures its engine). small: ~25M, for runs that should learn more.
_SHAPES: dict[Size, dict[str, int]] = {
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "small": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
}
CONTEXT_LENGTH = 2048


def _config(arch: Arch, size: Size, vocab_size: int, pad_id: int, eos_id: int) -> PretrainedConfig:
    shape = _SHAPES[size]
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        max_position_embeddings=CONTEXT_LENGTH,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
        head_dim=shape["hidden_size"] // shape["num_attention_heads"],
        **shape,
    )
    if arch == "llama":
        return LlamaConfig(tie_word_embeddings=False, **common)
    if arch == "qwen3":
        return Qwen3Config(tie_word_embeddings=True, **common)
    raise ValueError(f"unknown arch {arch!r}; choose llama or qwen3")


def init_model(
    path: str | Path,
    arch: Arch = "llama",
    size: Size = "tiny",
    tokenizer: TokenizerKind = "bytes",
    seed: int = 0,
) -> int:
    """Write config.json, model.safetensors and the tokenizer to `path`; return #parameters."""
    if tokenizer != "bytes":
        raise ValueError(f"unknown tokenizer {tokenizer!r}; only 'bytes' is built locally")
    if size not in _SHAPES:
        raise ValueError(f"unknown size {size!r}; choose one of {sorted(_SHAPES)}")
    tok = build_byte_tokenizer()
    pad_id, eos_id = tok.pad_token_id, tok.eos_token_id
    assert isinstance(pad_id, int) and isinstance(eos_id, int)  # the byte tokenizer names both
    config = _config(arch, size, len(tok), pad_id, eos_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())
