"""Loading settings: a TOML file, then environment variables (RLBUS_A__B), then dotted CLI
overrides (--a.b-c VALUE), later wins. Unknown or invalid fields fail before anything starts,
named.

pydantic-settings layers the three: an InitSettingsSource (the overrides), its
EnvSettingsSource and its TomlConfigSettingsSource, in that priority, handed to the model as
`_build_sources` because the file is chosen per call, not per class. The overrides are parsed
here: its CliSettingsSource is argparse, which cannot take both `--flag` (True) and
`--flag false`, nor reach into dict fields (`--envs.NAME.path`), and rejects a misspelt field
as an unrecognized argument instead of naming it beside the other invalid fields.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeGuard, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_settings import (
    EnvSettingsSource,
    InitSettingsSource,
    SettingsError,
    TomlConfigSettingsSource,
)

from rlbus.config.base import ConfigError
from rlbus.config.settings import Settings

S = TypeVar("S", bound=Settings)


def parse_overrides(args: list[str], model: type[BaseModel] | None = None) -> dict[str, Any]:
    """`--kafka.bootstrap-servers host:9092 --run-id r1` -> {"kafka": {"bootstrap_servers": ...}}.

    Values stay strings; pydantic coerces them by field type. `--flag` with no value is True.
    A field's name takes `-` for `_`; the name of an entry of `model`'s named sections (`envs`)
    stays as written (`--envs.reverse-text.weight 2` is the entry `reverse-text`).
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(
                f"unexpected argument {arg!r}: overrides look like --section.field VALUE"
            )
        name, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
                i += 1
            else:
                value = "true"
        *parents, leaf = _keys(name.split("."), model)
        node = out
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--{name}: {part!r} is a value, not a section")
        node[leaf] = value
        i += 1
    return out


def _keys(parts: list[str], model: type[BaseModel] | None) -> list[str]:
    """The dict keys an override's dotted parts name, following `model`'s fields: a part under a
    dict of sections is an entry's name, kept; any other is a field's, `-` read as `_`."""
    keys: list[str] = []
    at: Any = model
    for part in parts:
        if _is_model(at):
            key = part.replace("-", "_")
            field = at.model_fields.get(key)
            at = field.annotation if field is not None else None
        elif get_origin(at) is dict and _is_model(get_args(at)[1]):
            key, at = part, get_args(at)[1]
        else:
            key, at = part.replace("-", "_"), None
        keys.append(key)
    return keys


def _is_model(annotation: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {field}: unknown field")
        else:
            lines.append(f"  {field}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def load_settings(
    path: str | Path | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
    model: type[S] = Settings,
) -> S:
    """Build settings from an optional TOML file, the environment and CLI overrides.

    Raises ConfigError naming every bad field.
    """
    cli = (
        parse_overrides(overrides, model) if isinstance(overrides, list) else dict(overrides or {})
    )
    # The TOML source skips a missing file silently; a named file must exist.
    if path is not None and not Path(path).expanduser().is_file():
        raise ConfigError(f"cannot read config {path}: no such file")
    try:
        toml = TomlConfigSettingsSource(model, toml_file=path)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    sources = (InitSettingsSource(model, cli), EnvSettingsSource(model), toml)
    try:
        # The sources go in through BaseSettings' private init argument (pyproject pins it).
        return model(_build_sources=(sources, {}))  # pyright: ignore[reportCallIssue]
    except ValidationError as exc:
        source = ", ".join(
            filter(None, [str(path) if path else "", "environment", "CLI" if cli else ""])
        )
        raise ConfigError(format_validation_error(exc, source)) from exc
    except SettingsError as exc:  # a complex field's env var that is not JSON
        raise ConfigError(f"invalid config (environment): {exc}") from exc


def settings_variables(settings: Settings) -> dict[str, str]:
    """Settings as RLBUS_* environment variables, to hand a child process the same config."""
    env: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}__{key.upper()}" if prefix else key.upper(), sub)
        elif value is not None:
            env[f"RLBUS_{prefix}"] = str(value).lower() if isinstance(value, bool) else str(value)

    walk("", settings.model_dump(mode="json"))
    return env
