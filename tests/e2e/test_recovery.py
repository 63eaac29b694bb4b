"""Failures against a cluster of this module's own (the tests kill and restart processes):
kill -9 of a broker during acks=all produce, committed offsets across broker restarts,
idempotent producer retries."""

import os
import signal
import threading
import time
import uuid

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory, e2e):
    with e2e.running_cluster(tmp_path_factory.mktemp("recovery")) as c:
        yield c


def _restart_broker(cluster, broker: int, sig: int) -> None:
    node = f"broker-{broker}"
    pid = cluster.pids()[node]
    os.kill(pid, sig)
    cluster.wait_restarted(node, pid)


def test_kill9_during_acks_all_produce_keeps_every_acknowledged_record_once(own_cluster, e2e):
    from confluent_kafka import Producer

    cluster = own_cluster
    topic = e2e.topic_name("k9")
    e2e.create_topic(cluster.bootstrap, topic, partitions=4)
    leaders = e2e.wait_for_leaders(cluster.bootstrap, topic, 4)
    victim = leaders[0]

    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "message.timeout.ms": 120_000,
            "retry.backoff.ms": 100,
        }
    )
    acked: list[bytes] = []
    failed: list[str] = []
    lock = threading.Lock()

    def on_delivery(err, msg):
        with lock:
            if err is None:
                acked.append(msg.value())
            else:
                failed.append(str(err))

    stop = threading.Event()

    def produce_loop() -> None:
        i = 0
        while not stop.is_set():
            try:
                producer.produce(topic, value=b"v-%08d" % i, key=str(i).encode(), on_delivery=on_delivery)
                i += 1
            except BufferError:
                pass
            producer.poll(0.001 if i % 50 else 0.01)

    thread = threading.Thread(target=produce_loop, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while len(acked) < 2000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(acked) >= 2000, f"produce did not get going: {failed[:3]}"
    _restart_broker(cluster, victim, signal.SIGKILL)
    # keep producing through the recovery, then a little more
    target = len(acked) + 2000
    deadline = time.monotonic() + 90
    while len(acked) < target and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(30)
    assert producer.flush(120) == 0
    assert not failed, failed[:5]
    assert len(acked) >= target

    msgs = e2e.consume(cluster.bootstrap, topic, len(acked), timeout=120)
    values = [m.value() for m in msgs]
    missing = set(acked) - set(values)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
    duplicates = len(values) - len(set(values))
    assert duplicates == 0, f"{duplicates} duplicated records"
    # per partition, offsets are dense from 0: no holes, no rewrites
    by_partition: dict[int, list[int]] = {}
    for m in msgs:
        by_partition.setdefault(m.partition(), []).append(m.offset())
    for partition, offsets in by_partition.items():
        assert offsets == list(range(len(offsets))), f"partition {partition} offsets not dense"


def test_committed_offsets_survive_broker_restarts(own_cluster, e2e):
    from confluent_kafka import Consumer

    cluster = own_cluster
    topic = e2e.topic_name("co")
    group = f"g-{uuid.uuid4().hex[:8]}"
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)
    e2e.produce(cluster.bootstrap, topic, [b"old-%d" % i for i in range(100)])

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen = []
    deadline = time.monotonic() + 60
    while len(seen) < 100 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            seen.append(msg.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert len(seen) == 100

    # a graceful restart of one broker and a crash of the other: the coordinator moves or
    # restarts either way, and committed offsets live in the __consumer_offsets streams
    _restart_broker(cluster, 1, signal.SIGTERM)
    _restart_broker(cluster, 2, signal.SIGKILL)

    e2e.produce(cluster.bootstrap, topic, [b"new-%d" % i for i in range(30)])
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    resumed = []
    deadline = time.monotonic() + 90
    while len(resumed) < 30 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            resumed.append(msg.value())
    end = time.monotonic() + 1.0
    while time.monotonic() < end:  # anything re-delivered from before the commit shows up now
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            resumed.append(msg.value())
    consumer.close()
    assert sorted(resumed) == sorted(b"new-%d" % i for i in range(30))


def test_idempotent_producer_no_duplicates(own_cluster, e2e):
    cluster = own_cluster
    topic = e2e.topic_name("idem")
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)
    values = [b"i-%d" % i for i in range(3000)]
    acked = e2e.produce(
        cluster.bootstrap,
        topic,
        values,
        **{
            "enable.idempotence": True,
            "max.in.flight.requests.per.connection": 5,
            "linger.ms": 1,
            "batch.num.messages": 50,
        },
    )
    assert len(acked) == len(values)
    msgs = e2e.consume(cluster.bootstrap, topic, len(values))
    assert sorted(m.value() for m in msgs) == sorted(values)
    # per key order within a partition is the produce order
    for p in {m.partition() for m in msgs}:
        ordered = [int(m.value()[2:]) for m in msgs if m.partition() == p]
        assert ordered == sorted(ordered)
