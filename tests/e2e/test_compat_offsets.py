"""ListOffsets MAX_TIMESTAMP (-3) answers the offset of the record with the largest timestamp
(KIP-734), not the last offset of its batch, with a real admin client."""

import time

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from automq.broker.kafka import records


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_max_timestamp_is_the_record_not_the_batch(cluster, e2e, compression):
    topic = e2e.topic_name("maxts")
    e2e.create_topic(cluster.bootstrap, topic)
    now = int(time.time() * 1000)
    # one batch (long linger, one flush): the middle record carries the largest timestamp
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 500, "compression.type": compression})
    offsets: list[int] = []
    stamps = [now - 3000, now - 1000, now - 2000, now - 2500]
    for i, ts in enumerate(stamps):
        producer.produce(
            topic, key=b"k%d" % i, value=b"v", timestamp=ts, on_delivery=lambda err, msg: offsets.append(msg.offset())
        )
    assert producer.flush(30) == 0 and len(offsets) == 4
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    tp = TopicPartition(topic, 0)
    info = admin.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(timeout=30)
    assert (info.offset, info.timestamp) == (sorted(offsets)[1], now - 1000)


def test_offset_of_max_timestamp_unit():
    recs = [records.encode_record(i, d, b"k", b"v") for i, d in enumerate([0, 50, 50, 10])]
    batch = records.build_batch(100, recs, last_offset_delta=3, base_timestamp=1000, max_timestamp=1050)
    assert records.offset_of_max_timestamp(batch) == (101, 1050)  # the first record at the max
