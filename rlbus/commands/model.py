"""`rlbus model init`: tiny local models, built from a config (nothing downloaded).

torch and transformers are imported inside the command: every `rlbus` invocation imports this
module, and most never touch a model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rlbus.console import console
from rlbus.consumers.inference.api import Arch, Size, TokenizerKind

model_app = typer.Typer(no_args_is_help=True, help="Build models locally (nothing downloaded).")


@model_app.callback()
def model_group() -> None:
    """Create local models (random init, built from a config; nothing downloaded)."""
    # A callback keeps `model` a command group even while `init` is its only command.


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


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
