"""Transactional requests straight to a broker's handlers (no socket): the calls the KIP-890 and
transaction-tooling tests make. (tests/support is on sys.path: `from txn_requests import ...`.)"""

from __future__ import annotations

import datetime
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder

from automq.broker.kafka import codec, handlers
from automq.broker.kafka.context import RequestContext

PRODUCE = 0


async def call(broker: Any, api_key: int, version: int, **fields: Any) -> Any:
    request = codec.build(codec.request_class(api_key, version), **fields)
    ctx = RequestContext(
        api_key, version, 1, "test-client", "127.0.0.1:5555", codec.response_class(api_key, version), broker
    )
    registration = handlers.lookup(api_key)
    assert registration is not None
    return await registration.handler(request, ctx)


def txn_batch(pid: int, epoch: int, sequence: int, count: int = 2) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=sequence,
        batch_size=1 << 20,
    )
    for i in range(count):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k", value=b"v", headers=[])
    return bytes(builder.build())


async def produce(broker: Any, version: int, tid: str | None, topic: str, index: int, batch: bytes) -> Any:
    cls = codec.request_class(PRODUCE, version)
    topic_cls = codec.nested(cls, "TopicProduceData")
    part_cls = codec.nested(cls, "PartitionProduceData")
    r = await call(
        broker,
        PRODUCE,
        version,
        transactional_id=tid,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            codec.build(topic_cls, name=topic, partition_data=(codec.build(part_cls, index=index, records=batch),)),
        ),
    )
    # the answer names the topic it was asked about (a verification path once answered a tuple)
    assert [t.name for t in r.responses] == [topic], r.responses
    return r.responses[0].partition_responses[0]
