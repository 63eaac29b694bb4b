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


def test_only_the_keyless_records_fail_with_invalid_record_the_rest_with_invalid_different_record(cluster, e2e):
    """KIP-467 (librdkafka test 0011's record_fail case): the batch is refused whole, and the
    response's record errors name the keyless records, so the client fails those with
    INVALID_RECORD and the batch's other records with _INVALID_DIFFERENT_RECORD."""
    topic = e2e.topic_name("compact-kip467")
    e2e.create_topic(cluster.bootstrap, topic, configs={"cleanup.policy": "compact"})
    # one batch of all ten, however slow this machine is: a linger far longer than the loop
    # below takes; flush() sends at once without waiting for it
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "linger.ms": 30_000, "enable.idempotence": False, "retries": 0}
    )
    outcome: dict[int, int | None] = {}
    for i in range(10):
        key = None if i in (3, 7) else f"k{i}".encode()
        producer.produce(
            topic,
            value=f"v{i}".encode(),
            key=key,
            partition=0,
            on_delivery=lambda err, msg, i=i: outcome.__setitem__(i, err.code() if err else None),
        )
    assert producer.flush(60) == 0
    assert outcome == {
        i: KafkaError.INVALID_RECORD if i in (3, 7) else KafkaError._INVALID_DIFFERENT_RECORD for i in range(10)
    }


def test_keyless_record_indices():
    encoded = [records.encode_record(i, i, key, b"v") for i, key in enumerate([b"a", None, b"", None, b"b"])]
    batch = records.build_batch(0, encoded, last_offset_delta=4, base_timestamp=1, max_timestamp=5)
    header = records.parse_header(batch)
    assert records.keyless_record_indices(batch, header) == [1, 3]
    assert records.keyless_record_indices(batch, header, limit=1) == [1]


def test_keyless_record_index():
    encoded = [records.encode_record(i, i, key, b"v" * 300) for i, key in enumerate([b"a" * 200, b"", None, b"b"])]
    batch = records.build_batch(0, encoded, last_offset_delta=3, base_timestamp=1, max_timestamp=4)
    assert records.keyless_record_index(batch, records.parse_header(batch)) == 2
    keyed = records.build_batch(0, encoded[:2], last_offset_delta=1, base_timestamp=1, max_timestamp=2)
    assert records.keyless_record_index(keyed, records.parse_header(keyed)) is None
    with pytest.raises((ValueError, IndexError)):
        records.keyless_record_index(batch[:-400], records.parse_header(batch))
