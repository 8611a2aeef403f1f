"""A lazy, re-iterable sequence of tasks: select / shuffle / skip / take compose without
materialising, so an infinite generator works as well as a file."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator

from rlbus.schemas import TaskPublished


class TaskStream:
    def __init__(self, source: Callable[[], Iterable[TaskPublished]]):
        self._source = source

    def __iter__(self) -> Iterator[TaskPublished]:
        return iter(self._source())

    def _then(
        self, step: Callable[[Iterable[TaskPublished]], Iterable[TaskPublished]]
    ) -> TaskStream:
        source = self._source
        return TaskStream(lambda: step(source()))

    def select(self, keep: Callable[[TaskPublished], bool]) -> TaskStream:
        return self._then(lambda tasks: filter(keep, tasks))

    def skip(self, n: int) -> TaskStream:
        return self._then(lambda tasks: itertools.islice(tasks, n, None))

    def take(self, n: int | None) -> TaskStream:
        return self if n is None else self._then(lambda tasks: itertools.islice(tasks, n))

    def shuffle(self, seed: int, buffer: int = 10_000) -> TaskStream:
        """Shuffle within a sliding buffer: exact for sets up to `buffer` tasks, and still lazy
        (and deterministic per seed) for larger or infinite ones."""

        def shuffled(tasks: Iterable[TaskPublished]) -> Iterator[TaskPublished]:
            rng = random.Random(seed)
            pool: list[TaskPublished] = []
            for task in tasks:
                if len(pool) < buffer:
                    pool.append(task)
                    continue
                i = rng.randrange(buffer)
                yield pool[i]
                pool[i] = task
            rng.shuffle(pool)
            yield from pool

        return self._then(shuffled)
