"""`rlbus model init` and `rlbus worker inference`: tiny local models and the inference role."""

from __future__ import annotations

from typing import Annotated

import typer

from rlbus.commands.common import OVERRIDES, OVERRIDES_HELP, ConfigOption, settings_from
from rlbus.consumers.inference.api import BackendKind
from rlbus.consumers.inference.cli import model_app, serve
from rlbus.discovery import require_bootstrap


def inference(
    ctx: typer.Context,
    model: Annotated[
        str, typer.Option(help="Hugging Face model directory (e.g. from `rlbus model init`).")
    ],
    host: Annotated[
        str, typer.Option(help="Address to bind; 0.0.0.0 in a container.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="HTTP port of the OpenAI-compatible and token endpoints.")
    ] = 8000,
    backend: Annotated[
        BackendKind, typer.Option(help="hf: built-in transformers engine; vllm: GPU extra.")
    ] = "hf",
    device: Annotated[str, typer.Option(help="torch device for the hf backend.")] = "cpu",
    threads: Annotated[
        int | None, typer.Option(help="torch intra-op threads (1 suits tiny models).")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Serve a model (OpenAI chat completions, token-in/token-out generate, score) and load
    every WeightVersion of the run as it is published."""
    settings = require_bootstrap(settings_from(ctx, config))
    serve(model, host, port, backend, settings=settings, device=device, threads=threads)


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.add_typer(model_app, name="model", help="Build models locally (nothing downloaded).")
    worker_app.command(context_settings=OVERRIDES, epilog=OVERRIDES_HELP)(inference)
