"""The settings every process shares: Kafka, the store, the claim check, telemetry and the
run id. TOML file < environment (RLBUS_KAFKA__BOOTSTRAP_SERVERS) < dotted CLI overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from rlbus.config.base import Section

DATA_DIR = "rlbus-data"
"""The local state directory of the embedded defaults, relative to the working directory."""
DEFAULT_STORE_URL = f"chdb://./{DATA_DIR}"
DEFAULT_DEDUP_WINDOW = 10_000


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
    """Largest produce request in bytes; events over claim_check.threshold_bytes never get near
    it."""
    linger_ms: int = Field(5, ge=0)
    """Producer batching delay in milliseconds."""
    fetch_max_records: int = Field(2000, ge=1)
    """Most records one consumer poll hands to a handler."""
    ack_ledger: str = ""
    """Directory where a process writes, when its bus stops, the highest offset the broker
    acknowledged per topic and partition; `rlbus run` sets it, to count what a dead embedded
    broker took with it. Empty: not written."""
    ack_ledger: str = ""
    """Directory where a process writes, when its bus stops, the highest offset the broker
    acknowledged per topic and partition; `rlbus run` sets it, to count what a dead embedded
    broker took with it. Empty: not written."""
    announce_every_s: float = Field(5.0, gt=0)
    """Trainers and inference workers re-publish their current weights version this often, so a
    consumer that restarts past the original (the orchestrator) learns where the run stands."""


class StoreConfig(Section):
    url: str = DEFAULT_STORE_URL
    """ClickHouse: chdb://PATH (in-process engine) or http(s)://[user:password@]host:8123[/database]."""
    batch_rows: int = Field(20_000, ge=1)
    """Sink flushes a table when this many rows are buffered..."""
    flush_interval_s: float = Field(0.5, gt=0)
    """...or when its oldest buffered row is this old."""
    serve_http: bool = True
    """While a process holds a chdb store, serve read-only queries to others on loopback."""
    http_host: str = "127.0.0.1"
    """Address of that read-only endpoint."""
    dedup_window: int = Field(DEFAULT_DEDUP_WINDOW, ge=0)
    """Inserted blocks remembered per table for insert_deduplication_token."""
    conflict_check_s: float = Field(5.0, gt=0)
    """The sink looks this often for ids newly stored with a second, different content (the
    `conflicts` view) and logs each once."""


class ClaimCheckConfig(Section):
    url: str = f"file://./{DATA_DIR}/claims"
    """fsspec URL where payloads over the threshold are written; events carry their URI."""
    threshold_bytes: int = Field(512 * 1024, ge=1)
    """Encoded events larger than this go through the claim check (Kafka's default limit is 1
    MiB)."""


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


def data_dir(settings: Settings) -> Path:
    """The chdb store's directory; for a server store, ./rlbus-data still holds local state
    (the broker's address, run logs, checkpoints)."""
    url = settings.store.url
    return Path(url[len("chdb://") :]) if url.startswith("chdb://") else Path(DATA_DIR)
