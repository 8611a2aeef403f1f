"""rlbus's partitioner against Kafka's default one: the same partition for every key, as
aiokafka's own murmur2 (a port of the Java client's) computes it."""

from __future__ import annotations

import random

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as kafka_murmur2

from rlbus.bus.partitioner import murmur2, partition_of

pytestmark = pytest.mark.fast


def test_murmur2_equals_the_java_clients_for_every_tail_length() -> None:
    rng = random.Random(7)
    for length in range(0, 80):
        for _ in range(40):
            key = rng.randbytes(length)
            assert murmur2(key) == kafka_murmur2(key), (length, key)
    for key in (b"", b"a", b"ab", b"abc", b"\xff" * 9, b"0196f3a2-7c1e-7a3b-9c2d-4e5f6a7b8c9d"):
        assert murmur2(key) == kafka_murmur2(key), key


@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 7, 64])
def test_a_key_goes_where_kafkas_default_partitioner_sends_it(partitions: int) -> None:
    rng = random.Random(partitions)
    every = list(range(partitions))
    default = DefaultPartitioner()
    keys = [rng.randbytes(rng.randrange(1, 48)) for _ in range(500)]
    chosen = [partition_of(key, every, every) for key in keys]
    assert chosen == [default(key, every, every) for key in keys]
    assert set(chosen) == set(every)  # keys spread over all of them


def test_an_unkeyed_message_goes_to_an_available_partition() -> None:
    assert {partition_of(None, [0, 1, 2, 3], [2]) for _ in range(50)} == {2}
    assert {partition_of(None, [0, 1], []) for _ in range(200)} == {0, 1}
