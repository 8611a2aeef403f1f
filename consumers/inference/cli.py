"""Command-line entry points: `rlbus model init` and the body of `rlbus worker inference`.

torch and transformers are imported inside the commands: every `rlbus` invocation imports
this module, and most never touch a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rlbus.config import Settings
from rlbus.consumers.inference.api import Arch, BackendKind, Size, TokenizerKind

console = Console()

model_app = typer.Typer(no_args_is_help=True)


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
    for name, value in (
        ("path", str(path)),
        ("arch", arch),
        ("size", size),
        ("parameters", f"{params:,}"),
        ("tokenizer", tokenizer),
        ("seed", str(seed)),
    ):
        table.add_row(name, value)
    console.print(table)


def serve(
    model_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    backend: BackendKind = "hf",
    *,
    settings: Settings | None = None,
    device: str = "cpu",
    model_name: str | None = None,
    renderer: str | None = None,
    policy_version: int = 0,
    worker_id: str | None = None,
    threads: int | None = None,
) -> None:
    """Serve the model over HTTP until interrupted; with `settings` (a reachable broker), also
    load every WeightVersion of `settings.run_id` and publish WeightLoaded.

    `threads` sets torch's intra-op threads: 1 suits tiny models on a shared small machine,
    where a second thread mostly waits for a core another process holds.
    """
    import torch
    import uvicorn

    from rlbus.consumers.inference.service import build_app, build_backend

    if threads:
        torch.set_num_threads(threads)

    engine = build_backend(model_path, backend, device=device, policy_version=policy_version)
    app = build_app(engine, model_path, model_name=model_name, renderer=renderer)
    name = model_name or Path(model_path).name
    console.print(
        f"[bold]inference[/bold] {name} ({backend} on {device}) at http://{host}:{port}/v1"
    )
    if settings is None:
        uvicorn.run(app, host=host, port=port, log_level="warning")
        return
    from rlbus.commands.common import run_until_signal
    from rlbus.consumers.inference.worker import run_worker

    console.print(
        f"following weights of run {settings.run_id!r} on {settings.kafka.bootstrap_servers}"
    )
    run_until_signal(lambda stop: run_worker(settings, engine, app, host, port, stop, worker_id))
