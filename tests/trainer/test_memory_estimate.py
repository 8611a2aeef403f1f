"""The memory estimates made before a model is loaded: parameters counted from config.json as
transformers builds the model (else from the safetensors headers), the trainer's estimate
before loading equal to the one after, and the figures that refuse a 7B Llama on this kind of
machine while SmolLM2-135M fits (consumers/model_size.py, consumers/trainer/memory.py,
consumers/inference/sizing.py, rlbus/launch/run_memory.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from support.model_configs import LLAMA_7B
from support.stored_runs import store_events

from rlbus.config.orchestrator import AlgorithmConfig, EnvEntry
from rlbus.config.runs import InferenceConfig, RunConfig
from rlbus.config.trainer import LoraConfig, TrainerConfig
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.sizing import check_serving_fits as check_serving
from rlbus.consumers.inference.sizing import serving_estimate
from rlbus.consumers.model_size import NotEnoughMemory, model_size
from rlbus.consumers.trainer.memory import check_training_fits as check_trainer
from rlbus.consumers.trainer.memory import estimate, estimate_from_size
from rlbus.launch.run_memory import check_run_fits
from rlbus.schemas import WeightVersion

GB = 10**9


SMALL = {
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
}


def config_dir(path: Path, config: dict[str, Any]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def built(config_class: str, sizes: dict[str, Any], path: Path) -> int:
    """Parameters of the model transformers builds from `sizes` (on the meta device: no memory),
    its config saved to `path` as save_pretrained writes it."""
    import transformers

    config = getattr(transformers, config_class)(**sizes)
    config.save_pretrained(path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("config_class", "sizes"),
    [
        ("LlamaConfig", {k: v for k, v in LLAMA_7B.items() if k not in ("architectures",)}),
        ("LlamaConfig", {**SMALL, "attention_bias": True, "mlp_bias": True}),
        ("LlamaConfig", {**SMALL, "tie_word_embeddings": True, "head_dim": 24}),
        ("MistralConfig", {**SMALL, "head_dim": 32}),
        ("Qwen2Config", SMALL),
        ("Qwen3Config", {**SMALL, "head_dim": 24, "tie_word_embeddings": True}),
        ("SmolLM3Config", {**SMALL, "pad_token_id": None, "bos_token_id": None}),
    ],
    ids=["llama-7b", "llama-biases", "llama-tied", "mistral", "qwen2", "qwen3", "smollm3"],
)
def test_parameters_are_counted_from_the_config_as_transformers_builds_them(
    config_class: str, sizes: dict[str, Any], tmp_path: Path
) -> None:
    params = built(config_class, sizes, tmp_path)
    size = model_size(tmp_path)
    assert size is not None and size.source == "config.json"
    assert size.params == params


def test_another_architecture_is_counted_from_its_safetensors_headers(tmp_path: Path) -> None:
    """GPT-2 is not of the Llama shape: its tensors' shapes are read from the file's header."""
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=300, n_positions=64)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path, safe_serialization=True)
    size = model_size(tmp_path)
    assert size is not None and size.source == "safetensors headers"
    assert size.params == sum(p.numel() for p in model.parameters())  # the tied head once
    assert (size.layers, size.hidden, size.vocab) == (2, 32, 300)
    assert model_size(tmp_path / "absent") is None  # no config: no estimate, loads as before


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tied"
    init_model(path, arch="qwen3", seed=0)
    return path


@pytest.mark.parametrize(
    "lora",
    [
        LoraConfig(),
        LoraConfig(enabled=True),
        LoraConfig(enabled=True, rank=4, target_modules="q_proj,v_proj", publish="merged"),
    ],
    ids=["full", "lora-all-linear", "lora-q-v-merged"],
)
def test_the_estimate_before_loading_is_the_one_after(tied: Path, lora: LoraConfig) -> None:
    """One formula: from the directory's config (adapters counted from the sizes) the estimate
    is the one the loaded model gives, LoRA adapters (peft's) included."""
    from rlbus.consumers.trainer.policy import load_policy, published_kind

    cfg = TrainerConfig(lora=lora, gradient_checkpointing=lora.enabled)
    size = model_size(tied)
    assert size is not None
    model = load_policy(tied, lora, gradient_checkpointing=cfg.gradient_checkpointing)
    adapters = published_kind(lora) == "lora-delta"
    assert estimate_from_size(size, cfg) == estimate(model, cfg.gradient_checkpointing, adapters)


def test_smollm2_fits_and_a_7b_llama_is_refused_with_its_estimate(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    seven_b = config_dir(tmp_path / "llama-7b", LLAMA_7B)
    cfg = TrainerConfig(micro_batch_tokens=1024)
    small, large = model_size(smollm2_dir), model_size(seven_b)
    assert small is not None and small.params == 134_515_008
    assert large is not None and large.params == 6_738_415_616
    # fp32 weights, gradients and AdamW's two moments, a published copy, 1 GiB runtime, and
    # activations: 4 bytes x (24 x layers x hidden + 4 x vocabulary) a token.
    small_est, large_est = estimate_from_size(small, cfg), estimate_from_size(large, cfg)
    assert small_est.fixed_bytes == 4 * 5 * small.params + (1 << 30)
    assert small_est.per_token_bytes == 4 * (24 * 30 * 576 + 4 * 49152)
    assert round(small_est.total(1024) / GB, 1) == 6.3
    assert round(large_est.total(1024) / GB, 1) == 149.3
    lora = estimate_from_size(large, cfg.model_copy(update={"lora": LoraConfig(enabled=True)}))
    assert round(lora.total(1024) / GB, 1) == 41.8
    # Inference on a CPU: fp32 weights, the KV cache of one full prefill (16,384 tokens), 1 GiB.
    small_serving, large_serving = (
        serving_estimate(small, "hf", "cpu"),
        serving_estimate(large, "hf", "cpu"),
    )
    assert small_serving is not None and large_serving is not None
    assert round(small_serving.total / GB, 1) == 2.4
    assert round(large_serving.total / GB, 1) == 45.2
    machine = 23 * GB

    assert check_trainer(cfg, smollm2_dir, available=machine) is not None
    with pytest.raises(NotEnoughMemory) as trainer:
        check_trainer(cfg, seven_b, available=machine)
    said = str(trainer.value)
    assert said.startswith("the trainer would need ~149.3 GB at trainer.micro_batch_tokens = 1024")
    assert "27.0 GB fp32 weights + 80.9 GB gradients and AdamW" in said
    assert "23.0 GB is available on cpu" in said and "trainer.lora.enabled = true" in said

    assert check_serving(smollm2_dir, "hf", "cpu", available=machine) is not None
    with pytest.raises(NotEnoughMemory, match=r"inference would need ~45.2 GB \(27.0 GB weights"):
        check_serving(seven_b, "hf", "cpu", available=machine)

    run = RunConfig(model=str(smollm2_dir), trainer=cfg)
    check_run_fits(run, available=machine)
    with pytest.raises(NotEnoughMemory) as whole:
        check_run_fits(run.model_copy(update={"model": str(seven_b)}), available=machine)
    said = str(whole.value)
    assert said.startswith("this run would need ~194.5 GB of this machine's memory")
    assert "for the trainer, the weights and optimizer state alone" in said
    assert "for inference, serve a smaller model" in said
    # Each fits alone, not both: what to lower for the pair.
    with pytest.raises(NotEnoughMemory, match="together they do not fit: lower trainer.micro"):
        check_run_fits(run, available=7 * GB)
    # Stored-version teachers are served here too, one server each (two environments naming one
    # version share it), even when the policy is served elsewhere.
    teachers = {
        name: EnvEntry(path="p", algorithm=AlgorithmConfig(name="opd", teacher=teacher))
        for name, teacher in (("a", "run:x@1"), ("b", "run:x@1"), ("c", "run:y@latest"))
    }
    elsewhere = InferenceConfig(url="http://127.0.0.1:1/v1")
    distilled = run.model_copy(update={"envs": teachers, "inference": elsewhere})
    check_run_fits(distilled, available=machine)
    with pytest.raises(NotEnoughMemory) as served:
        check_run_fits(distilled, available=10 * GB)
    said = str(served.value)
    assert "+ 2 teacher servers ~2.4 GB (" in said and "inference replica" not in said
    assert "serve the teachers yourself (algorithm.teacher_url)" in said


def test_lora_teachers_of_one_base_are_counted_as_one_server(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    """The store says which teachers are LoRA versions: those of one base share one server
    (launch/teachers.py), so the check counts that server once; a full version, and a version
    the store does not hold, each count one of their own."""
    store = f"chdb://{tmp_path / 'store'}"
    versions = [
        WeightVersion(run_id=run, version=1, uri=f"file:///w/{run}.safetensors", format=format)
        for run, format in (("a", "safetensors-lora"), ("b", "safetensors-lora"))
    ]
    versions.append(
        WeightVersion(run_id="full", version=1, uri="file:///w/f", format="safetensors")
    )
    store_events(store, [versions])
    teachers = {
        env: EnvEntry(path="p", algorithm=AlgorithmConfig(name="opd", teacher=teacher))
        for env, teacher in (("x", "run:a@1"), ("y", "run:b@latest"), ("z", "run:full@1"))
    }
    run = RunConfig.model_validate(
        {
            "model": str(smollm2_dir),
            "inference": {"url": "http://127.0.0.1:1/v1"},
            "store": {"url": store},
        }
    ).model_copy(update={"envs": teachers})
    with pytest.raises(NotEnoughMemory, match=r"\+ 2 teacher servers ~"):
        check_run_fits(run, available=3 * GB)
    unknown = {
        **teachers,
        "w": EnvEntry(path="p", algorithm=AlgorithmConfig(name="opd", teacher="run:gone@1")),
    }
    with pytest.raises(NotEnoughMemory, match=r"\+ 3 teacher servers ~"):
        check_run_fits(run.model_copy(update={"envs": unknown}), available=3 * GB)
