"""Issue 13, finding 5: secrets are never printed: the store password (in the URL or as
store.password), the SASL password and the endpoint token, in `rlbus config`, the `rlbus run`
banner, store error messages and logs. Kafka TLS/SASL and ClickHouse over https are configured
from the same settings."""

from __future__ import annotations

import logging
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from rlbus.bus.connection import client_options
from rlbus.bus.store import Store, StoreError, open_store
from rlbus.config import KafkaConfig, load_settings
from rlbus.launch.supervisor import banner

PASSWORD = "hunter2-d0e5"
SASL = "sasl-7c1f"
ENV = {
    "RLBUS_STORE__URL": f"https://analyst:{PASSWORD}@127.0.0.1:1/db",
    "RLBUS_KAFKA__SASL_PASSWORD": SASL,
}


def rlbus(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "rlbus", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**dict(__import__("os").environ), **env, "COLUMNS": "300"},
    )
    return done.stdout + done.stderr


@pytest.mark.slow
def test_rlbus_config_masks_passwords() -> None:
    out = rlbus("config", env=ENV)
    assert PASSWORD not in out and SASL not in out
    assert "https://analyst:**********@127.0.0.1:1/db" in out


@pytest.mark.slow
def test_store_errors_and_rlbus_sql_mask_the_password() -> None:
    out = rlbus("sql", "SELECT 1", env=ENV)  # nothing listens on port 1
    assert "failed" in out.lower() or "error" in out.lower(), out
    assert PASSWORD not in out
    with pytest.raises(StoreError) as refused:
        open_store(f"ftp://analyst:{PASSWORD}@host/db")
    assert PASSWORD not in str(refused.value) and "**********" in str(refused.value)


def test_the_run_banner_and_logs_mask_the_password(caplog: pytest.LogCaptureFixture) -> None:
    settings = load_settings(
        overrides={"store": {"url": "http://rlbus@ch:8123", "password": PASSWORD}}
    )
    assert settings.store.url.reveal() == f"http://rlbus:{PASSWORD}@ch:8123"  # what clients get
    line = banner(settings, Path("logs"))
    assert PASSWORD not in line and "store http://rlbus:**********@ch:8123" in line
    with caplog.at_level(logging.INFO):
        logging.getLogger("rlbus.test").info("store %s, %r", settings.store.url, settings.store)
    assert PASSWORD not in caplog.text and "**********" in caplog.text


def test_https_store_client_gets_tls_user_and_password() -> None:
    store = Store(f"https://analyst:{PASSWORD}@ch.example:8443/db", read_only=True,
                  server_url=f"https://analyst:{PASSWORD}@ch.example:8443/db")  # fmt: skip
    options = store.client_options()
    assert options == {
        "dsn": f"https://analyst:{PASSWORD}@ch.example:8443/db",
        "interface": "https",
    }
    assert PASSWORD not in f"{store.url} {store.url!r}"


async def test_kafka_clients_take_tls_and_sasl_from_the_config() -> None:
    kafka = KafkaConfig(
        bootstrap_servers="kafka.example:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="rlbus",
        sasl_password=SASL,
    )
    options = client_options(kafka)
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    assert options["ssl_context"].check_hostname
    assert (options["sasl_mechanism"], options["sasl_plain_username"]) == ("SCRAM-SHA-512", "rlbus")
    assert options["sasl_plain_password"] == SASL and SASL not in repr(kafka)
    for client in (AIOKafkaProducer, AIOKafkaConsumer, AIOKafkaAdminClient):
        client(**options)  # every client rlbus makes accepts them (none connects here)
    with pytest.raises(ValueError, match="sasl_username"):
        client_options(KafkaConfig(bootstrap_servers="k:9092", security_protocol="SASL_PLAINTEXT"))
    assert client_options(KafkaConfig(bootstrap_servers="k:9092")) == {
        "bootstrap_servers": "k:9092",
        "security_protocol": "PLAINTEXT",
    }
