"""Model configs of real sizes (config.json only, no weights), for the memory estimate's tests."""

from __future__ import annotations

from typing import Any

LLAMA_7B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
"""Llama-2-7B's config.json: its trainer needs ~149 GB at 1024 tokens a micro-batch, its
built-in inference server on a CPU ~45 GB."""
