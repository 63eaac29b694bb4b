"""Produce to a `cleanup.policy=compact` topic as Kafka answers it: a batch holding a record
without a key is refused with INVALID_RECORD (librdkafka test 0011), compressed or not;
keyed records (and empty keys) are accepted."""

import pytest
from confluent_kafka import KafkaError, Producer

from automq.broker.kafka import records


def _produce(bootstrap: str, topic: str, items: list[tuple[bytes | None, bytes]], **config) -> list:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 50, **config})
    results: list = []
    for key, value in items:
        producer.produce(topic, value=value, key=key, on_delivery=lambda err, msg: results.append(err))
    assert producer.flush(60) == 0
    return results


@pytest.mark.parametrize("compression", ["none", "gzip", "lz4", "zstd", "snappy"])
def test_keyless_records_to_compacted_topic_are_refused(cluster, e2e, compression):
    topic = e2e.topic_name("compact")
    e2e.create_topic(cluster.bootstrap, topic, configs={"cleanup.policy": "compact"})
    config = {"compression.type": compression, "enable.idempotence": False, "retries": 0}
    # keyed records and an empty key are fine
    assert _produce(cluster.bootstrap, topic, [(b"k1", b"v1"), (b"", b"v2")], **config) == [None, None]
    # one keyless record in a batch of keyed ones: the whole batch is refused
    errs = _produce(cluster.bootstrap, topic, [(b"k2", b"v"), (None, b"no key"), (b"k3", b"v")], **config)
    assert {e.code() if e else None for e in errs} == {KafkaError.INVALID_RECORD}, errs
    # a delete topic takes keyless records
    plain = e2e.topic_name("plain")
    e2e.create_topic(cluster.bootstrap, plain)
    assert _produce(cluster.bootstrap, plain, [(None, b"v")], **config) == [None]


def test_keyless_record_index():
    encoded = [records.encode_record(i, i, key, b"v" * 300) for i, key in enumerate([b"a" * 200, b"", None, b"b"])]
    batch = records.build_batch(0, encoded, last_offset_delta=3, base_timestamp=1, max_timestamp=4)
    assert records.keyless_record_index(batch, records.parse_header(batch)) == 2
    keyed = records.build_batch(0, encoded[:2], last_offset_delta=1, base_timestamp=1, max_timestamp=2)
    assert records.keyless_record_index(keyed, records.parse_header(keyed)) is None
    with pytest.raises((ValueError, IndexError)):
        records.keyless_record_index(batch[:-400], records.parse_header(batch))
