"""Token ids and log-probs on the wire: packed little-endian bytes (schemas/packed.py, what
rlbus's events carry) against msgpack arrays of numbers, the same values either way.

For one record of N token ids and N log-probs: bytes on the wire, encode and typed decode
(msgspec, as the codec does), and the cost of packing the two from Python lists (a producer
that holds lists pays it; the engine hands numpy arrays). Best of `--repeats` timings.

    python bench/packed.py [--tokens 1024] [--repeats 5]

Last line: RESULT packed_decode_vs_lists=<packed decode time / lists'>
packed_bytes_vs_lists=<packed size / lists'> pack_and_encode_vs_lists=<(packing + encode) /
the lists' encode>
"""

from __future__ import annotations

import argparse
import random
import timeit
from collections.abc import Callable

import msgspec

from rlbus.schemas.packed import LogProbs, TokenIds, pack_logprobs, pack_tokens


class Packed(msgspec.Struct):
    ids: TokenIds
    logprobs: LogProbs


class Lists(msgspec.Struct):
    ids: list[int]
    logprobs: list[float]


def best_us(fn: Callable[[], object], repeats: int, number: int = 2000) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeats)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    ids = [rng.randrange(50_000) for _ in range(args.tokens)]
    lps = [-rng.random() * 5 for _ in range(args.tokens)]
    encoder = msgspec.msgpack.Encoder()
    records = {
        "packed": (Packed(pack_tokens(ids), pack_logprobs(lps)), Packed),
        "lists": (Lists(ids, lps), Lists),
    }
    figures: dict[str, dict[str, float]] = {}
    for name, (record, kind) in records.items():
        wire = encoder.encode(record)
        decoder = msgspec.msgpack.Decoder(kind)
        assert decoder.decode(wire) == record
        figures[name] = {
            "bytes": len(wire),
            "encode_us": best_us(lambda r=record: encoder.encode(r), args.repeats),
            "decode_us": best_us(lambda w=wire, d=decoder: d.decode(w), args.repeats),
        }
        print(
            f"{name:>6}: {len(wire):,} bytes, encode {figures[name]['encode_us']:.2f} us, "
            f"decode {figures[name]['decode_us']:.2f} us ({args.tokens} ids + log-probs)"
        )
    packing_us = best_us(lambda: (pack_tokens(ids), pack_logprobs(lps)), args.repeats)
    print(f"packing both from Python lists: {packing_us:.2f} us")
    packed, lists = figures["packed"], figures["lists"]
    print(
        f"RESULT packed_decode_vs_lists={packed['decode_us'] / lists['decode_us']:.4f} "
        f"packed_bytes_vs_lists={packed['bytes'] / lists['bytes']:.3f} "
        f"pack_and_encode_vs_lists={(packing_us + packed['encode_us']) / lists['encode_us']:.2f}"
    )


if __name__ == "__main__":
    main()
