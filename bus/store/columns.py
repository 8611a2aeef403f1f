"""How an event field becomes a ClickHouse column: the one mapping that the DDL, the Arrow
insert path and the read-back path all follow: defined once here, so the three cannot drift
apart."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, get_args, get_origin

import msgspec
import numpy as np
import pyarrow as pa

from rlbus.schemas.events import Event

TIMESTAMP_TYPE = "DateTime64(6, 'UTC')"
"""`ts` (float Unix seconds) is stored at microsecond precision."""

LOW_CARDINALITY = frozenset(
    {
        "run_id",
        "env",
        "status",
        "model",
        "role",
        "finish_reason",
        "format",
        "algorithm",
        "branch_id",
        "consumer_group",
        "origin_topic",
        "error_kind",
        "split",
        "harness",
        "loss",
        "incident",
        "process",
    }
)
"""String fields with few distinct values per run: dictionary-encoded on disk and in memory."""


class Codec(enum.Enum):
    """How values move between a Struct field and its column."""

    PLAIN = "plain"
    TIMESTAMP = "timestamp"
    PACKED = "packed"
    """Packed little-endian bytes <-> Array(number)."""
    MAP = "map"
    STR_LIST = "str_list"
    JSON = "json"
    """Anything without a native column type travels as msgspec JSON in a String."""


@dataclass(frozen=True)
class Column:
    name: str
    ch_type: str
    """The ClickHouse type exactly as DESCRIBE TABLE prints it."""
    arrow_type: pa.DataType
    codec: Codec
    annotation: Any
    """The field's Python type, which JSON columns decode back into."""
    dtype: np.dtype | None = None
    """Element type of a PACKED column."""


@dataclass(frozen=True)
class ExtraColumn:
    """A column that is not an event field: where the row came from and when it landed."""

    name: str
    ch_type: str
    default: str = ""

    @property
    def spec(self) -> str:
        """Type and default, as CREATE TABLE takes them and DESCRIBE shows them."""
        return f"{self.ch_type} DEFAULT {self.default}" if self.default else self.ch_type


POSITION_COLUMNS: tuple[ExtraColumn, ...] = (
    ExtraColumn("kafka_partition", "UInt32"),
    ExtraColumn("kafka_offset", "UInt64"),
)
INGESTED_AT = ExtraColumn("ingested_at", TIMESTAMP_TYPE, "now64(6)")
DIGEST = "digest"
"""A hash of what the row's event says, computed by ClickHouse as the row is inserted: the last
column of the sorting key, so a merge collapses only true duplicates, and one id stored with
two contents stays visible (the conflicts view)."""


def digest_expression(kind: type[Event]) -> str:
    """cityHash64 over every event column but `ts`: a consumer that re-handles its input and
    re-publishes the same result under the same id, with a fresh timestamp, stores the same
    digest; different content under one id does not."""
    names = ", ".join(c.name for c in columns_of(kind) if c.name != "ts")
    return f"cityHash64({names})"


def extra_columns(kind: type[Event]) -> tuple[ExtraColumn, ...]:
    """The columns of `kind`'s table that are not event fields."""
    return (*POSITION_COLUMNS, INGESTED_AT, ExtraColumn(DIGEST, "UInt64", digest_expression(kind)))


def sorting_key(kind: type[Event]) -> tuple[str, ...]:
    return (*kind.order_by, DIGEST)


_PACKED_ARROW = {
    "Array(UInt32)": pa.uint32(),
    "Array(Float32)": pa.float32(),
    "Array(UInt8)": pa.uint8(),
}
_SCALARS: dict[Any, tuple[str, pa.DataType]] = {
    int: ("Int64", pa.int64()),
    float: ("Float64", pa.float64()),
    bool: ("Bool", pa.bool_()),
    bytes: ("String", pa.binary()),
}


def _packed_column(name: str, annotation: Any) -> Column | None:
    """A field annotated like schemas/packed.py's TokenIds: Meta(extra={"ch", "packed"})."""
    if get_origin(annotation) is not Annotated:
        return None
    for meta in get_args(annotation)[1:]:
        extra = meta.extra if isinstance(meta, msgspec.Meta) else None
        if extra and "ch" in extra:
            ch_type = extra["ch"]
            if ch_type not in _PACKED_ARROW or "packed" not in extra:
                raise TypeError(
                    f"field {name!r}: Meta extra {extra!r} names no packed array type this store "
                    f"knows ({sorted(_PACKED_ARROW)})"
                )
            return Column(
                name,
                ch_type,
                pa.list_(_PACKED_ARROW[ch_type]),
                Codec.PACKED,
                annotation,
                np.dtype(extra["packed"]),
            )
    return None


def _unconstrained(annotation: Any) -> Any:
    """The type under Annotated[T, Meta(ge=..., le=...)]: constraints act at decode, the column
    follows the type."""
    if get_origin(annotation) is Annotated:
        return _unconstrained(get_args(annotation)[0])
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (dict, list) and args:
        # dict and list subscript to their generic alias at runtime
        return origin[tuple(_unconstrained(a) for a in args)]  # type: ignore[index]
    return annotation


def column_for(name: str, annotation: Any) -> Column:
    """The column a field with this name and type annotation maps to."""
    packed = _packed_column(name, annotation)
    if packed is not None:
        return packed
    annotation = _unconstrained(annotation)
    if name == "ts" and annotation is float:
        return Column(
            name, TIMESTAMP_TYPE, pa.timestamp("us", tz="UTC"), Codec.TIMESTAMP, annotation
        )
    if annotation is str:
        ch_type = "LowCardinality(String)" if name in LOW_CARDINALITY else "String"
        return Column(name, ch_type, pa.string(), Codec.PLAIN, annotation)
    if annotation in _SCALARS:
        ch_type, arrow_type = _SCALARS[annotation]
        return Column(name, ch_type, arrow_type, Codec.PLAIN, annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is dict and len(args) == 2 and args[0] is str and args[1] in (int, float):
        ch_type, arrow_type = _SCALARS[args[1]]
        return Column(
            name, f"Map(String, {ch_type})", pa.map_(pa.string(), arrow_type), Codec.MAP, annotation
        )
    if origin is list and args == (str,):
        return Column(name, "Array(String)", pa.list_(pa.string()), Codec.STR_LIST, annotation)
    return Column(name, "String", pa.binary(), Codec.JSON, annotation)


@cache
def columns_of(kind: type[Event]) -> tuple[Column, ...]:
    """The event columns of `kind`'s table, in field order."""
    return tuple(column_for(f.name, f.type) for f in msgspec.structs.fields(kind))
