"""Consumer-group membership: the settings a subscriber joins its group with (KafkaConfig's
session, heartbeat, poll interval and static membership), and leaving the group on a clean
stop so that its partitions move to the other members at once.

aiokafka sends LeaveGroup on stop only past generation 0 (Kafka numbers a group's first
generation 1); the embedded broker (Tansu 0.6) numbers it 0, so a member stopped in its
group's first generation would hold its partitions until its session timed out.
`leave_first_generation` sends the LeaveGroup aiokafka leaves out. Static members never leave
(KIP-345: their place waits for their restart).
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import InvalidSessionTimeoutError, KafkaError
from aiokafka.protocol.group import LeaveGroupRequest

from rlbus.config import KafkaConfig

log = logging.getLogger(__name__)


def group_options(kafka: KafkaConfig) -> dict[str, Any]:
    """Keyword arguments of an AIOKafkaConsumer that joins a consumer group."""
    return {
        "session_timeout_ms": kafka.session_timeout_ms,
        "heartbeat_interval_ms": kafka.heartbeat_interval_ms,
        "max_poll_interval_ms": kafka.max_poll_interval_ms,
        "group_instance_id": kafka.group_instance_id or None,
    }


def session_refused(kafka: KafkaConfig, exc: InvalidSessionTimeoutError) -> ValueError:
    """The error a broker's refusal of the session timeout becomes: which field to change."""
    return ValueError(
        f"the broker refused kafka.session_timeout_ms = {kafka.session_timeout_ms} "
        f"({exc}): Kafka accepts only values within its group.min.session.timeout.ms and "
        "group.max.session.timeout.ms (6000 to 1800000 by default); set "
        "kafka.session_timeout_ms (RLBUS_KAFKA__SESSION_TIMEOUT_MS) within them"
    )


async def leave_first_generation(consumer: AIOKafkaConsumer) -> None:
    """Before `consumer.stop()`: send the LeaveGroup that aiokafka leaves out in generation 0.
    Heartbeats stop first, so no rejoin can follow the leave before the consumer closes."""
    # aiokafka has no public call for this; its own leave (on stop) goes the same way.
    coordinator = consumer._coordinator
    if (
        not isinstance(coordinator, GroupCoordinator)
        or coordinator.generation != 0
        or coordinator._group_instance_id is not None
        or not coordinator.member_id
    ):
        return
    await coordinator._stop_heartbeat_task()
    try:
        await coordinator._send_req(LeaveGroupRequest(coordinator.group_id, coordinator.member_id))
    except KafkaError as exc:  # best effort, as aiokafka's own: the session timeout remains
        log.warning("LeaveGroup of group %s failed: %s", coordinator.group_id, exc)
