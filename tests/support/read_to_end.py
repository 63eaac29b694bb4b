"""Reading a topic to its end with librdkafka at an isolation level, for the transaction tests."""

from __future__ import annotations

import time
import uuid


def read_to_end(
    bootstrap: str, topic: str, partitions: int, level: str = "read_committed", timeout: float = 30.0
) -> list[bytes]:
    """Every value a fresh consumer of `level` reads from offset 0 up to the end of each of the
    topic's partitions (the high watermark, or the last stable offset for read_committed).
    Fails if some partition's end is not reached in `timeout` seconds: for read_committed that
    is a transaction left open (a stuck last stable offset)."""
    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": level,
        }
    )
    consumer.subscribe([topic])
    out: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(eof) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                continue
            eof.discard(msg.partition())
            out.append(msg.value())
    finally:
        consumer.close()
    assert len(eof) == partitions, f"{level} did not reach the end of every partition of {topic} within {timeout}s"
    return out
