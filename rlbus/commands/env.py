"""`rlbus env install|list|remove`: environment packages, each in a venv of its own under the
data directory (rlbus.environment.hosted.venvs). Not `rlbus worker env`, the env producer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rlbus.commands.common import (
    OVERRIDES,
    OVERRIDES_HELP,
    ConfigOption,
    exits_on,
    fail,
    settings_from,
)
from rlbus.config import data_dir
from rlbus.console import console
from rlbus.environment.hosted.venvs import EnvInstallError, install_env, installed_envs, remove_env

env_app = typer.Typer(
    no_args_is_help=True,
    help="""Environment packages, each in a venv of its own under the data directory
(DATA_DIR/envs/NAME), with its own dependencies; verifiers:NAME, openenv:PACKAGE and
textarena:GAME run them in a worker process of their own.

```
rlbus env install my-env        # from PyPI (or a wheel, a folder, a git URL)
rlbus env install my-env --index https://hub.example/simple/
rlbus env list
rlbus env remove my-env
```
""",
)


def _data_dir(ctx: typer.Context, config: Path | None) -> Path:
    return data_dir(settings_from(ctx, config))


@env_app.command("install", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def env_install(
    ctx: typer.Context,
    spec: Annotated[
        str,
        typer.Argument(
            help="What pip installs: a PyPI name (with a version, extras), a wheel or sdist, "
            "a local folder, or a URL pip takes (git+https://...)."
        ),
    ],
    index: Annotated[
        str | None,
        typer.Option(
            help="A hub-style package index (PEP 503 simple) to install from, beside PyPI "
            "(pip's --extra-index-url; with --index-only, pip's --index-url)."
        ),
    ] = None,
    index_only: Annotated[
        bool, typer.Option(help="Install from --index alone, dependencies included.")
    ] = False,
    python: Annotated[
        str | None,
        typer.Option(help="The interpreter the venv is made from (default: rlbus's)."),
    ] = None,
    force: Annotated[
        bool, typer.Option(help="Install again over an installed environment of that name.")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Install an environment package into a venv of its own: DATA_DIR/envs/NAME, NAME its
    distribution's name. The package and its dependencies go there, nothing into rlbus's
    environment; pip runs without rlbus's settings and secrets in its environment."""
    if index_only and index is None:
        raise fail("--index-only needs --index URL")
    root = _data_dir(ctx, config)
    with exits_on(EnvInstallError):
        record = install_env(
            root,
            spec,
            index=index,
            index_only=index_only,
            python=python or sys.executable,
            force=force,
            say=_say,
        )
    table = Table(title=f"rlbus env install {spec}", show_header=False)
    for name, value in [
        ("name", record.name),
        ("distribution", f"{record.distribution} {record.version}"),
        ("modules", ", ".join(record.modules) or "(none found)"),
        ("python", record.python),
        ("venv", record.path),
    ]:
        table.add_row(name, value)
    console.print(table)


@env_app.command("list", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def env_list(ctx: typer.Context, config: ConfigOption = None) -> None:
    """The installed environments: name, version, modules, spec and venv."""
    root = _data_dir(ctx, config)
    envs = installed_envs(root)
    if not envs:
        console.print(
            f"no environment installed in {root.resolve() / 'envs'}: rlbus env install SPEC",
            markup=False,
            soft_wrap=True,
        )
        return
    table = Table(title="rlbus env list")
    for column in ("name", "version", "modules", "spec", "path"):
        table.add_column(column, overflow="fold")
    for env in envs:
        table.add_row(env.name, env.version, ", ".join(env.modules), env.spec, env.path)
    console.print(table)


@env_app.command("remove", context_settings=OVERRIDES, epilog=OVERRIDES_HELP)
def env_remove(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The environment's name (as `rlbus env list`).")],
    config: ConfigOption = None,
) -> None:
    """Remove an installed environment's venv."""
    with exits_on(EnvInstallError):
        record = remove_env(_data_dir(ctx, config), name)
    console.print(f"removed {record.name} ({record.path})", markup=False, soft_wrap=True)


def _say(line: str) -> None:
    console.print(f"  {line}", markup=False, soft_wrap=True)


def register(app: typer.Typer, worker_app: typer.Typer) -> None:
    app.add_typer(env_app, name="env")
