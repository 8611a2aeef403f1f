"""Loading settings: a TOML file, then environment variables (RLBUS_A__B), then dotted CLI
overrides (--a.b-c VALUE). Unknown or invalid fields fail before anything starts, named."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from rlbus.config.base import ConfigError
from rlbus.config.settings import Settings

S = TypeVar("S", bound=Settings)


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """`--kafka.bootstrap-servers host:9092 --run-id r1` -> {"kafka": {"bootstrap_servers": ...}}.

    Values stay strings; pydantic coerces them by field type. `--flag` with no value is True.
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
        *parents, leaf = [part.replace("-", "_") for part in name.split(".")]
        node = out
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--{name}: {part!r} is a value, not a section")
        node[leaf] = value
        i += 1
    return out


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
    model: type[S] = Settings,  # type: ignore[assignment]
    toml_table: str | None = None,
) -> S:
    """Build settings from an optional TOML file, the environment and CLI overrides.

    `toml_table` picks a sub-table of the file when the same file also holds other sections
    (e.g. environment config). Raises ConfigError naming every bad field.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        if toml_table is not None:
            data = data.get(toml_table, {})
    cli = parse_overrides(overrides) if isinstance(overrides, list) else dict(overrides or {})
    # Env vars must beat the file but lose to the CLI; pydantic-settings only orders sources
    # against init kwargs, so the file is validated as a base and the env layered on top.
    try:
        env_only = model()
        env_set = env_only.model_dump(exclude_defaults=True)
        merged = deep_merge(deep_merge(data, env_set), cli)
        return model(**merged)
    except ValidationError as exc:
        source = ", ".join(
            filter(None, [str(path) if path else "", "environment", "CLI" if cli else ""])
        )
        raise ConfigError(format_validation_error(exc, source)) from exc


def settings_env(settings: Settings) -> dict[str, str]:
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
