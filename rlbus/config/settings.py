"""The settings every process shares: Kafka, the store, the claim check, telemetry and the
run id. TOML file < environment (RLBUS_KAFKA__BOOTSTRAP_SERVERS) < dotted CLI overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rlbus.config.base import Section
from rlbus.config.secret import Secret, SecretUrl

DATA_DIR = "rlbus-data"
"""The local state directory of the embedded defaults, relative to the working directory."""
DEFAULT_STORE_URL = f"chdb://./{DATA_DIR}"
DEFAULT_DEDUP_WINDOW = 1_000
"""Blocks a table remembers for insert dedup. What a sink sends again after a crash or a
takeover is the few blocks since its last commit; older copies (a replayed topic) collapse in
ReplacingMergeTree all the same. Each remembered block holds ~250 B of the engine's memory, so
10,000 grew a sink's engine by ~9 MB/h for hours until every table's log was full
(docs/benchmarks.md, "Where the sink's engine memory went")."""


class KafkaConfig(Section):
    bootstrap_servers: str | None = None
    """Kafka bootstrap servers (host:port,...). Unset: start the embedded Tansu broker."""
    topic_prefix: str = "rlbus."
    """Prefix of every rlbus topic name."""
    partitions: int = Field(default=4, ge=1)
    """Partitions for topics that rlbus creates on first use."""
    replication_factor: int = Field(default=1, ge=1)
    """Replication factor for topics that rlbus creates."""
    max_request_size: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest produce request in bytes; events over claim_check.threshold_bytes never get near
    it."""
    linger_ms: int = Field(default=5, ge=0)
    """Producer batching delay in milliseconds."""
    request_timeout_ms: int = Field(default=40_000, ge=1)
    """How long a publish waits for the broker to acknowledge it. Past this the consumer runs
    its handler again after a pause (1 s, doubling up to 30 s): outputs keep their ids, and an
    env producer publishes the rollouts it already ran rather than running them again."""
    fetch_max_records: int = Field(default=2000, ge=1)
    """Most records one consumer poll hands to a handler."""
    fetch_max_wait_ms: int = Field(default=100, ge=0)
    """Longest a consumer's fetch waits at the broker for records to arrive. The embedded broker
    answers a fetch only when this wait is over, even when records arrived meanwhile (a Kafka
    broker answers as soon as they do): an idle consumer sees a new event up to this late, on
    every hop of the loop (a weight version reaching the inference included). Lower: sooner,
    for more fetches an idle consumer sends (`python bench/bus_latency.py` measures both). A
    Kafka or Redpanda deployment may set Kafka's own default, 500, for fewer idle fetches."""
    ack_ledger: str = ""
    """Directory where a process writes, when its bus stops, the highest offset the broker
    acknowledged per topic and partition; `rlbus run` sets it, to count what a dead embedded
    broker took with it. Empty: not written."""
    session_timeout_ms: int = Field(default=2000, ge=1)
    """A consumer-group member the broker has not heard from for this long is taken out of its
    group, and its partitions go to the others (after a SIGKILL, a lost host). Lower: a dead
    member's partitions move sooner, but a member whose event loop stalls this long is taken
    out too (it rejoins, and what it had not committed is handled again). The default suits
    the embedded broker; a Kafka broker accepts only values within its
    group.min.session.timeout.ms and group.max.session.timeout.ms (6000 to 1800000 by
    default), so set 6000 or more there (deploy/ sets 10000)."""
    heartbeat_interval_ms: int = Field(default=500, ge=1)
    """How often a member tells the broker it is alive, and so learns of a rebalance: a member
    that left or died is noticed by the others within this. Under a third of
    session_timeout_ms."""
    max_poll_interval_ms: int = Field(default=30 * 60 * 1000, ge=1)
    """Longest a member may spend between polls (a batch handler still running: a trainer's
    step) before it leaves its group."""
    group_instance_id: str = ""
    """Static membership (KIP-345): a name this process keeps across restarts (a StatefulSet
    pod's name), sent as group.instance.id in each group it joins. A restart within
    session_timeout_ms takes back its place and partitions without moving anyone else's; but a
    static member never leaves on stop, so one stopped for good holds its partitions until
    session_timeout_ms. Empty: dynamic membership, where a clean stop leaves the group at
    once. (The embedded broker holds each static join and sync for 3 s: docs/scaling.md.)"""
    announce_every_s: float = Field(default=5.0, gt=0)
    """Trainers and inference workers re-publish their current weights version this often, so a
    consumer that restarts past the original (the orchestrator) learns where the run stands."""
    embedded_max_rss_mb: int = Field(default=0, ge=0)
    """The embedded broker's memory (RSS) past which `rlbus run` hands what is unfinished on it
    to a fresh one and restarts its roles there (Tansu's memory storage keeps every message; a
    Kafka or Redpanda keeps its own retention). 0: an eighth of this machine's memory."""
    embedded_handover_every_s: float = Field(default=600.0, gt=0)
    """The least time between two handovers: what is carried may itself pass
    embedded_max_rss_mb, and a run that hands over more often than this does little else."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """How every Kafka client connects: SSL (TLS), SASL_SSL (TLS + SASL login), SASL_PLAINTEXT
    (SASL login without TLS: only inside a trusted network), PLAINTEXT (the embedded broker)."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    """SASL mechanism, for the SASL_* protocols."""
    sasl_username: str = ""
    """SASL user name, for the SASL_* protocols."""
    sasl_password: Secret = Secret("")
    """SASL password (never printed); set it from the environment: RLBUS_KAFKA__SASL_PASSWORD."""
    ssl_cafile: str = ""
    """PEM file of the CA that signed the brokers' certificates (empty: the system's CAs)."""
    ssl_certfile: str = ""
    """PEM client certificate, for brokers that require mutual TLS."""
    ssl_keyfile: str = ""
    """PEM private key of ssl_certfile."""
    ssl_key_password: Secret = Secret("")
    """Password of ssl_keyfile, if it is encrypted (never printed)."""
    ssl_check_hostname: bool = True
    """Check that a broker's certificate names the host connected to."""

    @model_validator(mode="after")
    def _heartbeat_within_session(self) -> KafkaConfig:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"kafka.heartbeat_interval_ms = {self.heartbeat_interval_ms} must be below "
                f"kafka.session_timeout_ms = {self.session_timeout_ms} (a third of it or less): "
                "a member must be heard from before its session ends"
            )
        return self


class StoreConfig(Section):
    url: SecretUrl = SecretUrl(DEFAULT_STORE_URL)
    """ClickHouse: chdb://PATH (in-process engine) or http(s)://[user:password@]host:8123[/database].
    Printed with its password masked; keep the password out of committed files (store.password
    from the environment, or the whole URL in RLBUS_STORE__URL)."""
    password: Secret = Secret("")
    """ClickHouse password, written into url (replacing one there) and never printed; set it
    from the environment (RLBUS_STORE__PASSWORD) or a Kubernetes Secret."""
    batch_rows: int = Field(default=20_000, ge=1)
    """Sink flushes a table when this many rows are buffered..."""
    flush_interval_s: float = Field(default=0.5, gt=0)
    """...or when its oldest buffered row is this old."""
    serve_http: bool = True
    """While a process holds a chdb store, serve read-only queries to others on loopback."""
    http_host: str = "127.0.0.1"
    """Address of that read-only endpoint (it requires the token in its endpoint file, which
    only its owner can read; another address exposes it beyond this machine's users)."""
    dedup_window: int = Field(default=DEFAULT_DEDUP_WINDOW, ge=0)
    """Inserted blocks remembered per table for insert_deduplication_token (DEFAULT_DEDUP_WINDOW
    says why 1,000)."""
    conflict_check_s: float = Field(default=5.0, gt=0)
    """The sink looks this often for ids newly stored with a second, different content (the
    `conflicts` view) and logs each once."""

    @model_validator(mode="after")
    def _password_into_url(self) -> StoreConfig:
        if self.password and self.url.startswith(("http://", "https://")):
            parts = urlsplit(self.url.reveal())
            user = parts.username or "default"
            host = parts.netloc.rpartition("@")[2]
            netloc = f"{user}:{quote(self.password.reveal(), safe='')}@{host}"
            self.url = SecretUrl(urlunsplit(parts._replace(netloc=netloc)))
        return self


class ClaimCheckConfig(Section):
    url: str = f"file://./{DATA_DIR}/claims"
    """fsspec URL of the claim store: payloads over the threshold are written there, and events
    carry only their key under it (a consumer reads nothing else)."""
    threshold_bytes: int = Field(default=512 * 1024, ge=1)
    """Encoded events larger than this go through the claim check (Kafka's default limit is 1
    MiB)."""
    max_bytes: int = Field(default=1024 * 1024 * 1024, ge=1)
    """Largest claim a consumer reads; a bigger one is dead-lettered."""
    read_timeout_s: float = Field(default=60.0, gt=0)
    """A claim not read within this is dead-lettered (a consumer is never wedged by it)."""
    retention_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """Claims older than this are deleted (by the processes that write claims). Keep it at
    least the topics' retention (Kafka's default: 7 days): a message still on a topic must
    find its claim."""


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


def data_dir(settings: Settings) -> Path:
    """The chdb store's directory; for a server store, ./rlbus-data still holds local state
    (the broker's address, run logs, checkpoints)."""
    url = settings.store.url
    return Path(url[len("chdb://") :]) if url.startswith("chdb://") else Path(DATA_DIR)
