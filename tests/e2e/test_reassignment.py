"""Partition reassignment while producing and consuming: nothing is lost or duplicated and
both clients follow the partition to its new broker (NOT_LEADER_OR_FOLLOWER + fresh metadata)."""

import threading
import time
import uuid

import pytest

pytestmark = pytest.mark.slow


def test_reassignment_while_producing_loses_nothing(cluster, e2e):
    from confluent_kafka import Consumer, Producer
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    topic = e2e.topic_name("ra")
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 2}
    )
    acked: list[bytes] = []
    failed: list[str] = []
    lock = threading.Lock()

    def on_delivery(err, msg):
        with lock:
            (failed.append(str(err)) if err is not None else acked.append(msg.value()))

    stop = threading.Event()

    def produce_loop() -> None:
        i = 0
        while not stop.is_set():
            try:
                producer.produce(topic, value=b"r-%07d" % i, key=str(i % 64).encode(), on_delivery=on_delivery)
                i += 1
            except BufferError:
                pass
            producer.poll(0.002)

    consumed: list[bytes] = []

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"ra-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])

    flushed = threading.Event()

    def consume_loop() -> None:
        # tail until everything acknowledged has been read (or the drain deadline passes)
        while not (flushed.is_set() and set(acked) <= set(consumed)):
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                consumed.append(msg.value())
            if flushed.is_set() and time.monotonic() > drain_deadline[0]:
                break

    drain_deadline = [float("inf")]
    threads = [threading.Thread(target=produce_loop, daemon=True), threading.Thread(target=consume_loop, daemon=True)]
    for t in threads:
        t.start()

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30_000)
    moves = 0
    try:
        for _round in range(3):
            time.sleep(1.0)
            leaders = e2e.wait_for_leaders(cluster.bootstrap, topic, 2)
            for partition, leader in leaders.items():
                target = 2 if leader == 1 else 1
                result = admin.alter_partition_reassignments({TopicPartition(topic, partition): [target]})
                assert result[TopicPartition(topic, partition)] is None, (
                    f"move of {partition} to {target} refused: {result}"
                )
                moves += 1
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                now = e2e.wait_for_leaders(cluster.bootstrap, topic, 2)
                if all(now[p] != leaders[p] for p in leaders):
                    break
                time.sleep(0.1)
            assert all(now[p] != leaders[p] for p in leaders), (
                f"leaders did not move within 30 s: {leaders} -> {now}; ongoing: {admin.list_partition_reassignments()}\n"
                + cluster.grep_logs(topic)
            )
    finally:
        admin.close()
    time.sleep(1.0)
    stop.set()
    threads[0].join(30)
    assert producer.flush(60) == 0
    drain_deadline[0] = time.monotonic() + 60
    flushed.set()
    threads[1].join(90)
    consumer.close()

    assert moves == 6
    assert not failed, failed[:5]
    assert len(acked) > 0
    assert set(acked) <= set(consumed), f"{len(set(acked) - set(consumed))} acknowledged records never consumed"
    assert len(consumed) == len(set(consumed)), "records consumed twice"
    # and a fresh reader of the whole log finds each acknowledged record exactly once
    everything = [m.value() for m in e2e.consume(cluster.bootstrap, topic, len(acked))]
    assert sorted(everything) == sorted(acked)
