"""Which partition a keyed message goes to: Kafka's default choice (the Java client's and
aiokafka's), murmur2 of the key, positive, modulo the topic's partition count; so rlbus's
messages land where any other Kafka client would put the same key. aiokafka's murmur2 is
pure Python that assembles each 4-byte word from single bytes, a large share of what
publishing a message cost (bench/bus.py; the figures are in docs/benchmarks.md). This one reads
the words in one struct call."""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """MurmurHash2 as org.apache.kafka.common.utils.Utils.murmur2 computes it, unsigned."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for k in struct.unpack_from(f"<{whole >> 2}I", data):
        k = (k * _M) & _MASK
        k = ((k ^ (k >> 24)) * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    extra = length & 3
    if extra:
        if extra == 3:
            h ^= data[whole + 2] << 16
        if extra >= 2:
            h ^= data[whole + 1] << 8
        h = ((h ^ data[whole]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def partition_of(key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]) -> int:
    """aiokafka's `partitioner` callable: a keyed message's partition by murmur2, an unkeyed
    one's at random among the available partitions (all of them when none is)."""
    if key is None:
        return random.choice(available or all_partitions)
    return all_partitions[(murmur2(key) & 0x7FFFFFFF) % len(all_partitions)]
