"""Kafka bus, embedded broker, claim check, telemetry and the ClickHouse store (DESIGN.md: Delivery)."""

from rlbus.bus.broker import BrokerError, EmbeddedBroker, free_port
from rlbus.bus.kafka import Bus, Delivery

__all__ = ["BrokerError", "Bus", "Delivery", "EmbeddedBroker", "free_port"]
