"""Events <-> Arrow tables shaped like their ClickHouse table.

The insert path is the sink's hot loop, so it works a column at a time: packed token bytes are
joined once and viewed with numpy as the values of an Arrow ListArray, never unpacked into
Python lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from operator import attrgetter
from typing import Any, TypeVar

import msgspec
import numpy as np
import pyarrow as pa

from rlbus.bus.store.columns import Codec, Column, columns_of
from rlbus.schemas.events import Event

E = TypeVar("E", bound=Event)

_json = msgspec.json.Encoder()
_INT32_MAX = 2**31 - 1


def _packed_to_arrow(column: Column, values: Sequence[bytes]) -> pa.Array:
    assert column.dtype is not None
    itemsize = column.dtype.itemsize
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    if itemsize > 1 and (bad := np.flatnonzero(lengths % itemsize)).size:
        raise ValueError(
            f"{column.name}: row {bad[0]} holds {lengths[bad[0]]} bytes, not a whole number of "
            f"{column.dtype} elements ({itemsize} bytes each)"
        )
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths // itemsize, out=offsets[1:])
    flat = pa.array(np.frombuffer(b"".join(values), dtype=column.dtype))
    if offsets[-1] > _INT32_MAX:
        return pa.LargeListArray.from_arrays(pa.array(offsets), flat)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), flat)


def _to_arrow(column: Column, values: Sequence[Any]) -> pa.Array:
    if column.codec is Codec.PACKED:
        return _packed_to_arrow(column, values)
    if column.codec is Codec.TIMESTAMP:
        micros = np.rint(np.asarray(values, dtype=np.float64) * 1e6).astype(np.int64)
        return pa.array(micros, type=column.arrow_type)
    if column.codec is Codec.JSON:
        return pa.array(list(map(_json.encode, values)), type=pa.binary())
    return pa.array(values, type=column.arrow_type)


def events_to_arrow(
    events: Sequence[Event],
    partitions: Sequence[int] | np.ndarray,
    offsets: Sequence[int] | np.ndarray,
) -> pa.Table:
    """One Arrow table for events of a single kind, with the Kafka partition and offset each
    came from (the store computes each row's digest as it inserts it)."""
    kinds = set(map(type, events))
    if len(kinds) != 1:
        raise ValueError(
            f"expected events of one kind, got {sorted(k.__name__ for k in kinds) or 'none'}"
        )
    if not len(events) == len(partitions) == len(offsets):
        raise ValueError(
            f"{len(events)} events but {len(partitions)} partitions and {len(offsets)} offsets"
        )
    columns = columns_of(kinds.pop())
    # One pass per field with a C-level getter beats transposing per-event tuples (zip(*rows)).
    arrays = [_to_arrow(column, list(map(attrgetter(column.name), events))) for column in columns]
    arrays += [
        pa.array(np.asarray(partitions, dtype=np.uint32)),
        pa.array(np.asarray(offsets, dtype=np.uint64)),
    ]
    names = [c.name for c in columns] + ["kafka_partition", "kafka_offset"]
    return pa.Table.from_arrays(arrays, names=names)


def _packed_from_arrow(column: Column, array: pa.Array) -> list[bytes]:
    assert column.dtype is not None
    raw = array.values.to_numpy(zero_copy_only=False).astype(column.dtype, copy=False).tobytes()
    bounds = (array.offsets.to_numpy() * column.dtype.itemsize).tolist()
    return [raw[a:b] for a, b in pairwise(bounds)]


def _from_arrow(column: Column, chunks: pa.ChunkedArray) -> list[Any]:
    array = chunks.combine_chunks().cast(column.arrow_type)
    if column.codec is Codec.PACKED:
        return _packed_from_arrow(column, array)
    if column.codec is Codec.TIMESTAMP:
        return (array.cast(pa.int64()).to_numpy() / 1e6).tolist()
    if column.codec is Codec.MAP:
        return [dict(pairs) for pairs in array.to_pylist()]
    if column.codec is Codec.JSON:
        decoder = msgspec.json.Decoder(column.annotation)
        return [decoder.decode(raw) for raw in array.to_pylist()]
    return array.to_pylist()


def arrow_to_events(kind: type[E], table: pa.Table) -> list[E]:
    """Rows of `kind`'s table back into Structs; columns that are not fields are ignored."""
    columns = columns_of(kind)
    missing = [c.name for c in columns if c.name not in table.column_names]
    if missing:
        raise ValueError(f"{kind.table}: result lacks the columns {missing} of {kind.__name__}")
    values = [_from_arrow(c, table.column(c.name)) for c in columns]
    names = [c.name for c in columns]
    return [kind(**dict(zip(names, row, strict=True))) for row in zip(*values, strict=True)]
