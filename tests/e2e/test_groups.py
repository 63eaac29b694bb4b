"""Consumer groups with real clients: rebalancing across members, committed offsets."""

import threading
import time
import uuid

import pytest

pytestmark = pytest.mark.slow


class Member(threading.Thread):
    """A confluent-kafka group member polling in its own thread, committing what it reads."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 500,
                "partition.assignment.strategy": "range",
            }
        )
        self.consumer.subscribe([topic])
        self.values: list[bytes] = []
        self.assignment: set[int] = set()
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            msg = self.consumer.poll(0.2)
            with self.lock:
                self.assignment = {tp.partition for tp in self.consumer.assignment()}
            if msg is None or msg.error():
                continue
            with self.lock:
                self.values.append(msg.value())
            self.consumer.commit(msg, asynchronous=False)
        self.consumer.close()  # LeaveGroup: the others rebalance at once

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(30)


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_group_rebalances_across_members_and_resumes_from_commits(cluster, e2e):
    topic = e2e.topic_name("grp")
    group = f"g-{uuid.uuid4().hex[:8]}"
    e2e.create_topic(cluster.bootstrap, topic, partitions=4)
    e2e.produce(cluster.bootstrap, topic, [b"a%d" % i for i in range(100)])

    a = Member(cluster.broker_bootstrap(1), group, topic)
    a.start()
    _wait(lambda: a.assignment == {0, 1, 2, 3}, 60, "member a to own all 4 partitions")
    b = Member(cluster.broker_bootstrap(2), group, topic)
    b.start()
    _wait(
        lambda: len(a.assignment) == 2 and len(b.assignment) == 2 and not (a.assignment & b.assignment),
        60,
        "a rebalance splitting 4 partitions 2/2",
    )
    e2e.produce(cluster.bootstrap, topic, [b"b%d" % i for i in range(100)])
    _wait(lambda: len(set(a.values) | set(b.values)) == 200, 60, "all 200 records consumed by the group")

    b.stop()
    _wait(lambda: a.assignment == {0, 1, 2, 3}, 60, "member a to take back all partitions after b left")
    a.stop()
    consumed = a.values + b.values
    assert set(consumed) == {b"a%d" % i for i in range(100)} | {b"b%d" % i for i in range(100)}

    # a new member of the same group resumes after the committed offsets: only new records
    e2e.produce(cluster.bootstrap, topic, [b"c%d" % i for i in range(40)])
    c = Member(cluster.bootstrap, group, topic)
    c.start()
    _wait(lambda: len(c.values) >= 40, 60, "the resumed member to read the 40 new records")
    time.sleep(1.0)  # anything re-delivered from before the commits would arrive by now
    c.stop()
    assert sorted(c.values) == sorted(b"c%d" % i for i in range(40))


def test_kafka_python_group_commit_and_committed_offsets(cluster, e2e):
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient

    topic = e2e.topic_name("kpg")
    group = f"kg-{uuid.uuid4().hex[:8]}"
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)
    e2e.produce(cluster.bootstrap, topic, [b"m%d" % i for i in range(60)])
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=cluster.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=20_000,
    )
    seen = 0
    for _ in consumer:
        seen += 1
        if seen == 60:
            break
    consumer.commit()
    positions = {tp.partition: consumer.position(tp) for tp in consumer.assignment()}
    consumer.close()
    assert sum(positions.values()) == 60

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        offsets = admin.list_group_offsets(group)[group]
        assert {tp.partition: meta.offset for tp, meta in offsets.items()} == positions
        assert group in str(admin.list_groups())
    finally:
        admin.close()
