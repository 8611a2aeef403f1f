"""Telling people when the broker is gone: one plain line when no bootstrap server has answered
for a few seconds, one when it answers again, instead of the Kafka client's stream of
connection errors (dozens a second, per process)."""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("rlbus.broker")

CHECK_EVERY_S = 2.0
DOWN_AFTER = 3
"""Failed checks in a row before the broker is reported down: within 10 s of its death."""


async def _answers(address: str, timeout_s: float = 1.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
    except (OSError, ValueError, TimeoutError):
        return False
    writer.close()
    return True


async def watch_broker(bootstrap_servers: str, role: str) -> None:
    """Check the bootstrap servers every CHECK_EVERY_S until cancelled; log the changes."""
    servers = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
    failed, since = 0, 0.0
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        if any([await _answers(s) for s in servers]):
            if failed >= DOWN_AFTER:
                log.warning("%s: broker %s answers again", role, bootstrap_servers)
            failed = 0
            continue
        failed += 1
        if failed == 1:
            since = time.time()
        if failed == DOWN_AFTER:
            log.error(
                "%s: broker %s unreachable since %s; nothing can be published or consumed, and "
                "what it held but no consumer had stored is lost if it does not come back "
                "(an embedded broker keeps its topics in memory)",
                role,
                bootstrap_servers,
                time.strftime("%H:%M:%S", time.localtime(since)),
            )


class Repeats(logging.Filter):
    """Lets one record of each message through per `every_s`; the Kafka client logs a failed
    connection on every retry."""

    def __init__(self, every_s: float = 60.0):
        super().__init__()
        self.every_s = every_s
        self.last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        key = f"{record.name}:{record.msg}"
        if now - self.last.get(key, -self.every_s) < self.every_s:
            return False
        self.last[key] = now
        return True


_quieted = False


def quiet_kafka_client() -> None:
    """Install the Repeats filter on the Kafka client's loggers (once per process)."""
    global _quieted
    if _quieted:
        return
    _quieted = True
    repeats = Repeats()
    for name in (
        "aiokafka",
        "aiokafka.conn",
        "aiokafka.client",
        "aiokafka.consumer.group_coordinator",
        "aiokafka.consumer.fetcher",
        "aiokafka.producer.sender",
    ):
        logging.getLogger(name).addFilter(repeats)
