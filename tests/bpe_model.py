"""SmolLM2-135M-Instruct's real BPE tokenizer and ChatML template (/work/cache/smollm2, or
$RLBUS_SMOLLM2), and a tiny random model directory that uses them: the real inference engine
and server with a real BPE vocabulary, at the cost of a 1.6M-parameter model."""

from __future__ import annotations

import os
import shutil
from functools import cache
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerBase

SMOLLM2 = Path(os.environ.get("RLBUS_SMOLLM2", "/work/cache/smollm2"))
IM_END = "<|im_end|>"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@cache
def smollm2_tokenizer() -> PreTrainedTokenizerBase:
    if not (SMOLLM2 / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"{SMOLLM2} holds no SmolLM2 tokenizer: set RLBUS_SMOLLM2 to a SmolLM2-135M-Instruct "
            "Hugging Face directory"
        )
    return AutoTokenizer.from_pretrained(SMOLLM2)


def tiny_bpe_model(path: Path) -> Path:
    """A 2-layer random Llama with SmolLM2's vocabulary, tokenizer and generation config."""
    tok = smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    for name in _TOKENIZER_FILES:
        shutil.copy(SMOLLM2 / name, path / name)
    return path
