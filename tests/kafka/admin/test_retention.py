"""Retention by time and size trims led partitions' streams (in-process brokers, real clients)."""

import time

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from automq.broker.kafka.retention import RetentionTask, partition_size


def _leader_broker(cluster, admin, topic):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = admin.list_topics(topic, timeout=10).topics.get(topic)
        if t is not None and t.error is None and t.partitions and t.partitions[0].leader >= 0:
            leader = t.partitions[0].leader
            broker = next(b for b in cluster.brokers if b.node_id == leader)
            try:
                return broker, broker.partitions.get(topic, 0)
            except Exception:
                pass
        time.sleep(0.05)
    raise AssertionError("no leader")


def _low_watermark(bootstrap, topic):
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()


def test_time_retention_trims_expired_batches_only(inprocess_cluster):
    bootstrap = inprocess_cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("rt", 1, 1, config={"retention.ms": "60000"})])["rt"].result(30)
    broker, partition = _leader_broker(inprocess_cluster, admin, "rt")
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    now_ms = int(time.time() * 1000)
    for i in range(10):  # ten old batches, then five fresh ones
        producer.produce("rt", b"old-%d" % i, timestamp=now_ms - 3_600_000 + i)
        producer.flush(10)
    for i in range(5):
        producer.produce("rt", b"new-%d" % i, timestamp=now_ms)
        producer.flush(10)
    task = RetentionTask(broker)
    trimmed = inprocess_cluster.run(task.run_once(now_ms))
    assert trimmed == {("rt", 0): 10}
    assert partition.log_start_offset == 10
    assert _low_watermark(bootstrap, "rt") == (10, 15)
    # nothing more expires: a second run is a no-op
    assert inprocess_cluster.run(task.run_once(now_ms)) == {}


def test_size_retention_keeps_at_least_retention_bytes(inprocess_cluster):
    bootstrap = inprocess_cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("rb", 1, 1, config={"retention.bytes": str(64 * 1024), "retention.ms": "-1"})])[
        "rb"
    ].result(30)
    broker, partition = _leader_broker(inprocess_cluster, admin, "rb")
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 8})
    for i in range(400):
        producer.produce("rb", b"%04d" % i + b"x" * 1020)
    producer.flush(30)
    task = RetentionTask(broker, run_bytes=8 * 1024)
    size_before = inprocess_cluster.run(partition_size(broker, partition))
    assert size_before >= 400 * 1024
    trimmed = inprocess_cluster.run(task.run_once())
    new_start = trimmed[("rb", 0)]
    assert 0 < new_start < 400
    index = inprocess_cluster.run(task.index(partition))
    # Kafka's rule: drop the oldest while what remains still holds retention.bytes
    assert 64 * 1024 <= index.total < 64 * 1024 + 8 * 1024 + 2048
    assert task.known_size("rb", 0) == index.total
    assert _low_watermark(bootstrap, "rb")[0] == new_start


def test_compact_only_topics_are_not_trimmed(inprocess_cluster):
    bootstrap = inprocess_cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("cp", 1, 1, config={"cleanup.policy": "compact", "retention.ms": "1"})])["cp"].result(
        30
    )
    broker, partition = _leader_broker(inprocess_cluster, admin, "cp")
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("cp", b"v", key=b"k", timestamp=int(time.time() * 1000) - 3_600_000)
    producer.flush(10)
    assert inprocess_cluster.run(RetentionTask(broker).run_once()) == {}
    assert partition.log_start_offset == 0


@pytest.mark.parametrize(
    "inprocess_cluster", [{"brokers": 1, "kafka": {"log_retention_check_interval_ms": 100}}], indirect=True
)
def test_broker_process_runs_retention_on_its_own(inprocess_cluster):
    """The broker process (BrokerService) starts the retention task with the configured
    check interval; nobody calls it by hand here."""
    from automq.broker.kafka.retention import retention_of

    bootstrap = inprocess_cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("auto", 1, 1, config={"retention.ms": "1000"})])["auto"].result(30)
    broker, partition = _leader_broker(inprocess_cluster, admin, "auto")
    task = retention_of(broker)
    assert task is not None and task.interval_ms == 100
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    producer.produce("auto", b"old", timestamp=int(time.time() * 1000) - 60_000)
    producer.flush(10)
    deadline = time.monotonic() + 30
    while partition.log_start_offset == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert partition.log_start_offset == 1
