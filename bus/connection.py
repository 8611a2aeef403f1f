"""How every Kafka client rlbus makes connects: the bootstrap servers and the security settings
of KafkaConfig (TLS, SASL PLAIN/SCRAM), one place for producers, consumers and admin clients."""

from __future__ import annotations

import ssl
from typing import Any

from aiokafka.helpers import create_ssl_context

from rlbus.config import KafkaConfig


def ssl_context(kafka: KafkaConfig) -> ssl.SSLContext:
    """The TLS context of the SSL and SASL_SSL protocols: the system's CAs unless ssl_cafile
    names one, a client certificate when ssl_certfile is set."""
    context = create_ssl_context(
        cafile=kafka.ssl_cafile or None,
        certfile=kafka.ssl_certfile or None,
        keyfile=kafka.ssl_keyfile or None,
        password=kafka.ssl_key_password.reveal() or None,
    )
    context.check_hostname = kafka.ssl_check_hostname
    if not kafka.ssl_cafile:
        context.load_default_certs()
    return context


def client_options(kafka: KafkaConfig) -> dict[str, Any]:
    """Keyword arguments every aiokafka client (producer, consumer, admin) takes."""
    options: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "security_protocol": kafka.security_protocol,
    }
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = ssl_context(kafka)
    if kafka.security_protocol.startswith("SASL_"):
        if not kafka.sasl_username:
            raise ValueError(
                f"kafka.security_protocol = {kafka.security_protocol} needs kafka.sasl_username "
                "and kafka.sasl_password (RLBUS_KAFKA__SASL_PASSWORD)"
            )
        options |= {
            "sasl_mechanism": kafka.sasl_mechanism,
            "sasl_plain_username": kafka.sasl_username,
            "sasl_plain_password": kafka.sasl_password.reveal(),
        }
    return options


def fetch_options(kafka: KafkaConfig) -> dict[str, Any]:
    """Keyword arguments of a consumer (aiokafka's or FastStream's) that waits for new records."""
    return {"fetch_max_wait_ms": kafka.fetch_max_wait_ms}
