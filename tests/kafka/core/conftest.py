"""Fixtures of the core Kafka tests. Real v2 record batches, built with kafka-python's batch builder (a real client's
encoder), so validation is tested against what producers actually send."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder


def make_batch(
    count: int = 3,
    *,
    value: bytes = b"v",
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp_ms: int = 1_700_000_000_000,
    compression: int = 0,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for i in range(count):
        builder.append(i, timestamp=timestamp_ms + i, key=None, value=value, headers=[])
    return bytes(builder.build())


@pytest.fixture(name="make_batch")
def make_batch_fixture():
    """make_batch(count, value=..., producer_id=..., ...) -> bytes of one real v2 batch."""
    return make_batch
