"""What a role built but the broker did not take, kept to go out as it was built.

After a broker error the subscriber runs the handler again (Subscriber's
`_until_the_broker_takes_it`). What the first call computed must go out as it was: a second
rollout of a task, or an LLM judge's second grade, is other content under the same derived ids,
which the store keeps beside the first (the conflicts view); and a trainer that skips a batch
it trained must still publish that step's record (`Unsent`, by the handler's input).

The orchestrator builds its batches and tasks from its own state, not from one input, and that
state already says they went out (a step counted, tasks counted in flight): they wait in an
`Outbox` until the broker takes them, as do the judge's error scores of groups that never
completed. `until_taken` is the pause between tries, for the
subscriber's handlers and for publishers that are no consumer (`rlbus eval`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Generic, TypeVar

from aiokafka.errors import KafkaError

T = TypeVar("T")

log = logging.getLogger(__name__)

RETRY_S, RETRY_MAX_S = 1.0, 30.0
"""The pause after a broker error, doubling up to the most."""


async def until_taken(call: Callable[[], Awaitable[T]], what: str) -> T:
    """`call()` again after each broker error (KafkaError: what it published was refused or
    timed out), after a growing pause; any other error is raised."""
    pause = RETRY_S
    while True:
        try:
            return await call()
        except KafkaError as exc:
            log.warning("%s hit a broker error (%r); trying again in %.0fs", what, exc, pause)
            await asyncio.sleep(pause)
            pause = min(2 * pause, RETRY_MAX_S)


class Unsent(Generic[T]):
    """Outputs by the key of their input (its event id, or its events' ids joined), from a
    refused publish until the next call takes them."""

    def __init__(self) -> None:
        self._kept: dict[str, T] = {}

    def take(self, key: str) -> T | None:
        """What was kept for `key`, if anything (no longer kept)."""
        return self._kept.pop(key, None)

    async def computed(self, key: str, compute: Callable[[], Awaitable[T]]) -> T:
        """What was kept for `key`, else what `compute` makes now."""
        kept = self.take(key)
        return kept if kept is not None else await compute()

    @contextlib.contextmanager
    def kept_if_refused(self, outputs: Mapping[str, T]) -> Iterator[None]:
        """Keep `outputs` when the publish inside fails on a broker error (which the subscriber
        answers by calling the handler again); any other error drops them with the input."""
        try:
            yield
        except KafkaError:
            self._kept.update(outputs)
            raise


class Outbox:
    """Publications sent in the order they were put; one the broker refused stays, with all put
    after it, for the next `send`."""

    def __init__(self) -> None:
        self._queue: deque[Callable[[], Awaitable[None]]] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, publish: Callable[[], Awaitable[None]]) -> None:
        self._queue.append(publish)

    async def send(self) -> None:
        """Run every publication put, in order, each removed once it returned; a broker error
        is raised with it and the rest kept."""
        while self._queue:
            await self._queue[0]()
            self._queue.popleft()
