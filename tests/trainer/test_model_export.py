"""`rlbus model export run:RUN_ID@VERSION OUT --base DIR`: a stored weight version of a real run
(the reverse_text example on a tiny model, every role in this process, the real broker and chdb)
written as a Hugging Face directory. `from_pretrained(OUT)` gives the logits the built-in engine
gives when it serves that version, full weights (a tied head, published in bf16) or LoRA deltas
merged onto the base (an untied head); the refusals name what is wrong."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from support.isolated import running_sink
from support.trained_runs import STEPS, Run, start_run
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.commands.model import model_app
from rlbus.consumers.inference.engine import Engine
from rlbus.launch.model_export import ModelExportError, export_version, version_spans

pytestmark = pytest.mark.slow

IDS = torch.tensor([[3, 50, 60, 70, 80, 90, 100, 7]])


@pytest.fixture(scope="module")
def full(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """qwen3 ties its head to the embedding; versions are full weights in bf16 (the default)."""
    return start_run(broker, tmp_path_factory.mktemp("full"), "qwen3", lora=False)


@pytest.fixture(scope="module")
def lora(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """llama (untied head), LoRA adapters published alone: each version a delta over the base."""
    return start_run(broker, tmp_path_factory.mktemp("lora"), "llama", lora=True)


def weights_uri(run: Run, version: int) -> str:
    with open_store(run.store, read_only=True) as store:
        rows = store.query(
            "SELECT uri FROM weight_versions FINAL WHERE run_id = {r:String} AND version = "
            "{v:Int64}",
            {"r": run.run_id, "v": version},
        ).rows
    return str(rows[0][0])


async def served_logits(run: Run, version: int) -> torch.Tensor:
    """The logits of the built-in engine once it serves `version`, loaded as a run loads it."""
    async with Engine.from_pretrained(run.base) as engine:
        await engine.load_weights(weights_uri(run, version), version)
        with torch.no_grad():
            return engine.model(input_ids=IDS).logits


def exported_logits(out: Path) -> tuple[torch.Tensor, torch.nn.Module]:
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        return model(input_ids=IDS).logits, model


def base_logits(run: Run) -> torch.Tensor:
    return exported_logits(run.base)[0]


def tensor_names(out: Path) -> set[str]:
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_a_full_version_and_latest_load_as_the_engine_serves_them(
    full: Run, tmp_path: Path
) -> None:
    out = tmp_path / "v1"
    summary = export_version(full.store, full.ref(1), out, full.base)
    assert (summary.version.version, summary.kind, summary.tied) == (1, "full", True)
    logits, model = exported_logits(out)
    torch.testing.assert_close(logits, asyncio.run(served_logits(full, 1)), atol=1e-5, rtol=0)
    assert not torch.allclose(logits, base_logits(full))  # a trained version, not the base
    # The head stays tied: stored once, one tensor in the loaded model.
    assert "lm_head.weight" not in tensor_names(out)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert model.lm_head.weight is model.model.embed_tokens.weight
    # The base's tokenizer and chat template come along.
    tokenizer, base_tokenizer = (
        AutoTokenizer.from_pretrained(out),
        AutoTokenizer.from_pretrained(full.base),
    )
    assert tokenizer.chat_template == base_tokenizer.chat_template
    assert tokenizer.encode("drow") == base_tokenizer.encode("drow")

    # @latest, through the CLI, while a sink process holds the store (read through its
    # endpoint, as `rlbus sql` reads it).
    with running_sink(full.settings, tmp_path / "logs"):
        result = CliRunner().invoke(
            model_app,
            [
                "export",
                full.ref("latest"),
                str(tmp_path / "latest"),
                "--base",
                str(full.base),
                "--store.url",
                full.store,
            ],
        )
    assert result.exit_code == 0, result.output
    assert "rlbus model export" in result.output
    latest, _ = exported_logits(tmp_path / "latest")
    torch.testing.assert_close(latest, asyncio.run(served_logits(full, STEPS)), atol=1e-5, rtol=0)


def test_a_lora_version_is_merged_onto_its_base(lora: Run, tmp_path: Path) -> None:
    # The run kept trainer states of its adapters alone: an export needs the version and --base.
    states = [torch.load(p, weights_only=False) for p in lora.checkpoints.glob("state/*/state.pt")]
    assert states and all(s["model"] and all(".lora_" in n for n in s["model"]) for s in states)
    out = tmp_path / "lora"
    summary = export_version(lora.store, lora.ref("latest"), out, lora.base)
    assert (summary.version.version, summary.kind, summary.tied) == (STEPS, "lora-delta", False)
    logits, model = exported_logits(out)
    torch.testing.assert_close(logits, asyncio.run(served_logits(lora, STEPS)), atol=1e-5, rtol=0)
    assert not torch.allclose(logits, base_logits(lora))
    names = tensor_names(out)
    assert "lm_head.weight" in names and not any("lora" in n for n in names)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    # bf16 on request: the same weights, rounded once.
    half = export_version(lora.store, lora.ref(STEPS), tmp_path / "bf16", lora.base, "bfloat16")
    assert half.dtype == "bfloat16"
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


def narrower(base: Path, out: Path) -> Path:
    """`base`'s architecture with narrower MLP layers."""
    config = AutoConfig.from_pretrained(base)
    config.intermediate_size //= 2
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out


def test_refusals_name_what_is_wrong(full: Run, lora: Run, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ModelExportError, match=rf"no run 'nope'.*runs with some: {full.run_id}"):
        export_version(full.store, "run:nope@1", out, full.base)
    with pytest.raises(
        ModelExportError, match="no weight version 9 in the store; its versions: 0-2"
    ):
        export_version(full.store, full.ref(9), out, full.base)
    with pytest.raises(ModelExportError, match="neither a number nor latest"):
        export_version(full.store, f"run:{full.run_id}@newest", out, full.base)
    with pytest.raises(ModelExportError, match="names no stored version"):
        export_version(full.store, f"{full.run_id}@1", out, full.base)
    with pytest.raises(ModelExportError, match="--base is missing: the store does not record"):
        export_version(full.store, full.ref(1), out, None)
    # A base of another architecture: the version's tensors do not fit it.
    with pytest.raises(ModelExportError, match=r"version 1 of run .* does not fit the base"):
        export_version(full.store, full.ref(1), out, lora.base)
    # LoRA deltas fit qwen3's layers by shape; the run's parameter count tells them apart.
    with pytest.raises(ModelExportError, match=r"had [\d,]+ parameters with its adapters"):
        export_version(lora.store, lora.ref(1), out, full.base)
    with pytest.raises(ModelExportError, match=r"LoRA deltas .* do not fit.*mlp"):
        export_version(lora.store, lora.ref(1), out, narrower(lora.base, tmp_path / "narrow"))
    # A weights file the trainer pruned (here: moved away) is named, with the ones left.
    path = full.checkpoints / "weights" / "v000001.safetensors"
    moved = path.rename(tmp_path / "moved.safetensors")
    try:
        with pytest.raises(
            ModelExportError, match=r"weights file of version 1 .* is gone.*remain: 0, 2"
        ):
            export_version(full.store, full.ref(1), out, full.base)
    finally:
        moved.rename(path)
    assert not out.exists()  # nothing was written by any of them
    out.mkdir()
    (out / "x").write_text("")
    with pytest.raises(ModelExportError, match="exists and is not empty; pass --force"):
        export_version(full.store, full.ref(1), out, full.base)
    result = CliRunner().invoke(
        model_app,
        [
            "export",
            full.ref(9),
            str(tmp_path / "cli"),
            "--base",
            str(full.base),
            "--store.url",
            full.store,
        ],
    )
    assert result.exit_code == 2 and "its versions: 0-2" in result.output


def test_versions_are_listed_as_spans() -> None:
    assert version_spans([]) == "none"
    assert version_spans([0, 1, 2, 4, 6, 7]) == "0-2, 4, 6-7"
