"""The store the ui reads: opened read-only on first use, and opened again when the process whose
endpoint it read through has gone (a run ended; its directory can now be opened here)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from clickhouse_connect.driver.exceptions import OperationalError

from rlbus.bus.store import Rows, Store, open_store

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreSource:
    def __init__(self, url: str, reader: str = "rlbus ui"):
        self.url = url
        self.reader = reader
        """Who reads, as warnings name it."""
        self._store: Store | None = None
        self._lock = threading.Lock()

    @property
    def via(self) -> str | None:
        """The endpoint reads go through now, if any (None also before the first read)."""
        store = self._store
        return store.via if store is not None else None

    def store(self) -> Store:
        with self._lock:
            if self._store is None:
                self._store = open_store(self.url, read_only=True)
                if self._store.data_dir is not None:
                    log.warning(
                        "%s opened %s itself (no process serves it): a run cannot write to it "
                        "until %s stops",
                        self.reader,
                        self._store.data_dir,
                        self.reader,
                    )
            return self._store

    def use(self, action: Callable[[Store], T]) -> T:
        """`action(store)`, once more on a freshly opened store if the endpoint it read through
        stopped answering."""
        store = self.store()
        try:
            return action(store)
        except OperationalError:
            if store.via is None:
                raise
            log.info("the endpoint %s went away; opening %s again", store.via, self.url)
            self._drop(store)
            return action(self.store())

    def query(
        self,
        sql: str,
        parameters: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> Rows:
        return self.use(lambda store: store.query(sql, parameters, settings))

    def _drop(self, store: Store) -> None:
        with self._lock:
            if self._store is store:
                self._store = None
        store.close()

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()
