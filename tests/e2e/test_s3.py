"""The local cluster on SeaweedFS (a real S3 server): clients produce and consume, then the
whole cluster is stopped and started again on the same data dir and bucket — topics,
records and committed group offsets are all still there."""

import time
import uuid

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.s3]


@pytest.fixture(scope="module")
def s3_cluster(seaweedfs, tmp_path_factory, e2e):
    if not seaweedfs.running:
        seaweedfs.start()
    bucket = seaweedfs.create_bucket()
    cluster = e2e.LocalCluster(
        tmp_path_factory.mktemp("s3cluster"), 2, e2e.free_port_block(2), seaweedfs.url_for(bucket)
    ).start()
    try:
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            cluster.kill()


def test_s3_produce_consume_restart_recovers_everything(s3_cluster, e2e):
    from confluent_kafka import Consumer
    from kafka import KafkaConsumer, KafkaProducer

    cluster = s3_cluster
    topic = e2e.topic_name("s3")
    group = f"g-{uuid.uuid4().hex[:8]}"
    e2e.create_topic(cluster.bootstrap, topic, partitions=3, configs={"retention.ms": "86400000"})
    e2e.produce(cluster.bootstrap, topic, [b"c-%d" % i for i in range(500)])
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
    for i in range(100):
        producer.send(topic, b"k-%d" % i)
    producer.flush(60)
    producer.close()

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=cluster.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=20_000,
    )
    seen = []
    for msg in consumer:
        seen.append(msg.value)
        if len(seen) == 600:
            break
    consumer.commit()
    consumer.close()
    assert len(set(seen)) == 600

    # stop everything (graceful: brokers flush and upload) and start on the same data dir
    assert cluster.stop() == 0
    assert not cluster.pids(), "pid files left behind after a clean stop"
    cluster.start()

    msgs = e2e.consume(cluster.bootstrap, topic, 600, timeout=120)
    assert sorted(m.value() for m in msgs) == sorted(
        [b"c-%d" % i for i in range(500)] + [b"k-%d" % i for i in range(100)]
    )
    # the group resumes after its commits: only records produced after the restart
    e2e.produce(cluster.bootstrap, topic, [b"after-%d" % i for i in range(10)])
    resumed = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    resumed.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 10 and time.monotonic() < deadline:
        m = resumed.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    extra_deadline = time.monotonic() + 1.0
    while time.monotonic() < extra_deadline:
        m = resumed.poll(0.2)
        if m is not None and not m.error():
            got.append(m.value())
    resumed.close()
    assert sorted(got) == sorted(b"after-%d" % i for i in range(10))
