"""Cost of the keyless-record check on produce to compacted topics (records.keyless_record_index)
next to the per-batch validation every produce pays (records.validate_produce_records, with its
CRC-32C), on the same batches in the same run. Prints microseconds per batch and per record.

    python benchmarks/compacted_produce_bench.py [--records 500] [--value-bytes 100]
"""

from __future__ import annotations

import argparse
import struct
import time

import crc32c
import lz4.frame

from automq.broker.kafka import records


def _batch(count: int, value_bytes: int, codec: int) -> bytes:
    """A producer-like batch of keyed records; codec 3 = lz4 (records section compressed)."""
    encoded = [records.encode_record(i, i, b"key-%08d" % i, b"v" * value_bytes) for i in range(count)]
    batch = bytearray(
        records.build_batch(0, encoded, last_offset_delta=count - 1, base_timestamp=0, max_timestamp=count - 1)
    )
    if codec == 3:
        body = lz4.frame.compress(bytes(batch[records.BATCH_HEADER_SIZE :]))
        batch = batch[: records.BATCH_HEADER_SIZE] + body
        struct.pack_into(">i", batch, 8, len(batch) - records.LOG_OVERHEAD)
        struct.pack_into(">h", batch, records.ATTRIBUTES_OFFSET, codec)
    struct.pack_into(">I", batch, records.CRC_OFFSET, crc32c.crc32c(memoryview(batch)[records.ATTRIBUTES_OFFSET :]))
    return bytes(batch)


def _time(fn, rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - start) / rounds * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=500)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2000)
    args = ap.parse_args()
    for name, codec in (("none", 0), ("lz4", 3)):
        batch = _batch(args.records, args.value_bytes, codec)
        header = records.validate_produce_records(batch, 1 << 30)
        assert records.keyless_record_index(batch, header) is None
        base = _time(lambda b=batch: records.validate_produce_records(b, 1 << 30), args.rounds)
        check = _time(lambda b=batch, h=header: records.keyless_record_index(b, h), args.rounds)
        print(
            f"{name:5s} {args.records} records x {args.value_bytes} B ({len(batch)} B batch): "
            f"validation (baseline) {base:8.1f} us/batch; keyless check {check:8.1f} us/batch "
            f"= {check / args.records:.3f} us/record"
        )


if __name__ == "__main__":
    main()
