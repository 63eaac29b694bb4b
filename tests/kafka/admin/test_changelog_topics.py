"""Compacted topics as stream processors create and use them (issue 18 item 5, broker side):
the configs Kafka Streams, quixstreams and faust put on changelog and repartition topics are
accepted as given, and until the key-compaction job runs every record is kept and served,
tombstones included (null value, key kept), whatever compression the producer used."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

# What Kafka Streams (InternalTopicConfig / its defaults) and quixstreams/faust set on the
# topics they create, as a client sends them.
CHANGELOG = {"cleanup.policy": "compact", "message.timestamp.type": "CreateTime", "min.insync.replicas": "1"}
WINDOWED_CHANGELOG = {
    "cleanup.policy": "compact,delete",
    "retention.ms": str(86_400_000 + 3_600_000),
    "message.timestamp.type": "CreateTime",
}
REPARTITION = {
    "cleanup.policy": "delete",
    "segment.bytes": str(52_428_800),
    "segment.ms": "600000",
    "retention.ms": "-1",
    "message.timestamp.type": "CreateTime",
}
QUIX_CHANGELOG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "delete.retention.ms": "86400000"}


def test_stream_processor_topic_configs_are_accepted_as_given(inprocess_cluster):
    admin = AdminClient({"bootstrap.servers": inprocess_cluster.bootstrap})
    topics = {
        "app-store-changelog": CHANGELOG,
        "app-window-changelog": WINDOWED_CHANGELOG,
        "app-repartition": REPARTITION,
        "quix-changelog": QUIX_CHANGELOG,
    }
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=2, replication_factor=1, config=configs) for name, configs in topics.items()]
    )
    for f in futures.values():
        f.result(30)
    for name, configs in topics.items():
        resource = ConfigResource(ConfigResource.Type.TOPIC, name)
        described = admin.describe_configs([resource])[resource].result(30)
        for key, value in configs.items():
            assert described[key].value == value, (name, key)


def test_compacted_topic_keeps_and_serves_every_record_and_tombstone(inprocess_cluster):
    from kafka import KafkaProducer

    bootstrap = inprocess_cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("counts-changelog", num_partitions=1, replication_factor=1, config=CHANGELOG)])[
        "counts-changelog"
    ].result(30)
    expected: list[tuple[bytes, bytes | None]] = []
    rd = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 5, "acks": "all"})
    for i in range(60):
        key = b"k%d" % (i % 5)
        value = None if i % 7 == 6 else b"%d" % i  # tombstones between updates of the same keys
        rd.produce("counts-changelog", key=key, value=value)
        expected.append((key, value))
    assert rd.flush(30) == 0
    kp = KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip", acks="all", linger_ms=5)
    for i in range(60, 90):
        key = b"k%d" % (i % 5)
        value = None if i % 4 == 0 else b"%d" % i
        kp.send("counts-changelog", key=key, value=value)
        expected.append((key, value))
    kp.flush(30)
    kp.close()

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "changelog-restore",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition("counts-changelog", 0, 0)])
    got: list[tuple[bytes, bytes | None]] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < len(expected) and time.monotonic() < deadline:
            for m in consumer.consume(100, 0.5):
                assert m.error() is None, m.error()
                got.append((m.key(), m.value()))
    finally:
        consumer.close()
    # a state-store restore sees every update and every delete, in order
    assert got == expected
    assert sum(v is None for _, v in got) == sum(v is None for _, v in expected) > 0
