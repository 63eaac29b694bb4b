"""Kafka codec hot paths, sans-I/O: what the broker spends per request before storage.

    python benchmarks/kafka_codec_bench.py [--seconds 2]

Prints, next to a memcpy baseline measured in the same run:
- Produce decode of a 1 MiB request: in place (large frames) vs kio's copying decoder;
- batch validation (CRC-32C over the batch) + offset assignment;
- Fetch response encode of 1 MiB of stored batches as chunks (what the server writes);
- Fetch request decode with 1000 partitions (length pre-check + kio).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import time

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec, records
from automq.broker.kafka.handlers import registry


def rate(label: str, nbytes: int, fn, seconds: float) -> None:
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    elapsed = time.perf_counter() - start
    per = elapsed / n
    mib_s = nbytes * n / elapsed / (1 << 20) if nbytes else 0
    print(f"{label:<58} {per * 1e6:9.1f} µs/op" + (f" {mib_s:9.0f} MiB/s" if nbytes else ""))


def batch_of(size: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    value = b"x" * 1000
    for i in range(size // 1024):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
    return bytes(builder.build())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    s = parser.parse_args().seconds
    served = registry.served_ranges()

    batch = batch_of(1 << 20)
    rate("baseline: bytearray copy of a 1 MiB batch", len(batch), lambda: bytearray(batch), s)

    import kio.schema.produce.v9.request as p

    request = p.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            p.TopicProduceData(name="bench", partition_data=(p.PartitionProduceData(index=0, records=batch),)),
        ),
    )
    frame = codec.encode_request(1, request)
    rate(
        "Produce v9 decode, 1 MiB, kio (bytes frame, copies records)",
        len(frame),
        lambda: codec.decode_request(frame, served),
        s,
    )
    rate(
        "Produce v9 decode, 1 MiB, in place (bytearray frame)",
        len(frame),
        lambda: codec.decode_request(bytearray(frame), served),
        s,
    )

    def validate_and_assign() -> None:
        header = records.validate_produce_records(batch, 2 << 20)
        records.assign_offsets(bytearray(batch), 1000, 3)
        del header

    rate("validate (CRC-32C) + copy + assign offsets, 1 MiB", len(batch), validate_and_assign, s)

    fetch_cls = codec.response_class(1, 12)
    part_cls = codec.nested(fetch_cls, "PartitionData")
    topic_cls = codec.nested(fetch_cls, "FetchableTopicResponse")
    stored = [batch_of(64 << 10) for _ in range(16)]
    total = sum(len(b) for b in stored)

    def fetch_response(records_field):
        part = codec.build(
            part_cls,
            partition_index=0,
            error_code=ErrorCode.none,
            high_watermark=1,
            last_stable_offset=1,
            log_start_offset=0,
            aborted_transactions=None,
            preferred_read_replica=-1,
            records=records_field,
        )
        return codec.build(
            fetch_cls,
            throttle_time=codec.ZERO_THROTTLE,
            error_code=ErrorCode.none,
            session_id=0,
            responses=(codec.build(topic_cls, topic="bench", partitions=(part,)),),
        )

    rate(
        "Fetch v12 encode, 16 x 64 KiB batches joined + BytesIO",
        total,
        lambda: codec.encode_response(1, fetch_response(b"".join(stored))),
        s,
    )
    rate(
        "Fetch v12 encode, 16 x 64 KiB batches as chunks (served)",
        total,
        lambda: codec.encode_response_chunks(1, fetch_response(codec.RecordSet(stored))),
        s,
    )

    import kio.schema.fetch.v12.request as f

    parts = tuple(
        codec.build(
            f.FetchPartition,
            partition=i,
            current_leader_epoch=-1,
            fetch_offset=5,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=1 << 20,
        )
        for i in range(1000)
    )
    fetch_request = codec.build(
        f.FetchRequest,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(f.FetchTopic(topic="bench", partitions=parts),),
        forgotten_topics_data=(),
        rack_id="",
    )
    fetch_frame = codec.encode_request(1, fetch_request)
    rate("Fetch v12 request decode, 1000 partitions", 0, lambda: codec.decode_request(fetch_frame, served), s)


if __name__ == "__main__":
    main()
