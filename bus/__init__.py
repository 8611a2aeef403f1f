"""Kafka bus, embedded broker, claim check, telemetry and the ClickHouse store
(docs/architecture.md:
Delivery)."""

from rlbus.bus.broker import BrokerError, EmbeddedBroker, free_port
from rlbus.bus.bus import Bus
from rlbus.bus.subscribers import BatchSubscriber, Delivery, EventSubscriber

__all__ = [
    "BatchSubscriber",
    "BrokerError",
    "Bus",
    "Delivery",
    "EmbeddedBroker",
    "EventSubscriber",
    "free_port",
]
