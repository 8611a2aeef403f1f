"""The ClickHouse store (docs/architecture.md: Storage): event tables, migrations, the Store
client and the read-only loopback endpoint a chdb store's holder serves to other processes."""

from rlbus.bus.store.client import (
    Rows,
    Store,
    StoreError,
    StoreLockedError,
    open_store,
)
from rlbus.bus.store.endpoint import StoreEndpoint
from rlbus.bus.store.migrate import MigrationError

__all__ = [
    "StoreEndpoint",
    "MigrationError",
    "Rows",
    "Store",
    "StoreError",
    "StoreLockedError",
    "open_store",
]
