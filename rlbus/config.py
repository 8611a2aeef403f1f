"""Settings: pydantic models loaded from TOML, then env vars (RLBUS_A__B), then dotted CLI
overrides (--a.b-c VALUE). Unknown or invalid fields fail before anything starts."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class KafkaConfig(Section):
    bootstrap_servers: str | None = None
    """Kafka bootstrap servers (host:port,...). Unset: start the embedded Tansu broker."""
    topic_prefix: str = "rlbus."
    """Prefix of every rlbus topic name."""
    partitions: int = Field(4, ge=1)
    """Partitions for topics that rlbus creates on first use."""
    replication_factor: int = Field(1, ge=1)
    """Replication factor for topics that rlbus creates."""
    max_request_size: int = Field(4 * 1024 * 1024, ge=1024)
    """Largest produce request in bytes; events over claim_check.threshold_bytes never get near it."""
    linger_ms: int = Field(5, ge=0)
    """Producer batching delay in milliseconds."""
    fetch_max_records: int = Field(2000, ge=1)
    """Most records one consumer poll hands to a handler."""
    announce_every_s: float = Field(5.0, gt=0)
    """Trainers and inference workers re-publish their current weights version this often, so a
    consumer that restarts past the original (the orchestrator) learns where the run stands."""


class StoreConfig(Section):
    url: str = "chdb://./rlbus-data"
    """ClickHouse: chdb://PATH (in-process engine) or http(s)://[user:password@]host:8123[/database]."""
    batch_rows: int = Field(20_000, ge=1)
    """Sink flushes a table when this many rows are buffered..."""
    flush_interval_s: float = Field(0.5, gt=0)
    """...or when its oldest buffered row is this old."""
    serve_http: bool = True
    """While a process holds a chdb store, serve read-only queries to others on loopback."""
    http_host: str = "127.0.0.1"
    """Address of that read-only endpoint."""
    dedup_window: int = Field(10_000, ge=0)
    """Inserted blocks remembered per table for insert_deduplication_token."""


class ClaimCheckConfig(Section):
    url: str = "file://./rlbus-data/claims"
    """fsspec URL where payloads over the threshold are written; events carry their URI."""
    threshold_bytes: int = Field(512 * 1024, ge=1)
    """Encoded events larger than this go through the claim check (Kafka's default limit is 1 MiB)."""


class TelemetryConfig(Section):
    exporter: Literal["none", "console", "otlp"] = "none"
    """Where OpenTelemetry spans go."""
    otlp_endpoint: str = "http://127.0.0.1:4318/v1/traces"
    """OTLP/HTTP traces endpoint, for exporter = "otlp"."""
    service_name: str = "rlbus"
    """service.name resource attribute; roles append their name."""


class Settings(BaseSettings):
    """Every rlbus setting. TOML file < environment (RLBUS_KAFKA__BOOTSTRAP_SERVERS) < CLI."""

    model_config = SettingsConfigDict(
        env_prefix="RLBUS_",
        env_nested_delimiter="__",
        extra="forbid",
        use_attribute_docstrings=True,
    )

    run_id: str = "default"
    """Run this process belongs to; stamped on every event it publishes."""
    kafka: KafkaConfig = KafkaConfig()
    store: StoreConfig = StoreConfig()
    claim_check: ClaimCheckConfig = ClaimCheckConfig()
    telemetry: TelemetryConfig = TelemetryConfig()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # CLI overrides arrive as init kwargs and win over env, which wins over the TOML
        # (merged in by `load_settings` before init).
        return (init_settings, env_settings)


class ConfigError(ValueError):
    """A config problem, with the offending field named."""


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


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
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
    model: type[Settings] = Settings,
    toml_table: str | None = None,
) -> Settings:
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
        merged = _deep_merge(_deep_merge(data, env_set), cli)
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
