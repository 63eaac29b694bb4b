"""Transactions across partition moves (Kafka's AlterPartitionReassignments, kafka-python's
admin client, on a real 2-broker local cluster): a data partition moved to the other broker
mid-transaction, and the coordinator's `__transaction_state` partition moved mid-transaction.
Each transaction commits whole or aborts whole, its markers reach the partition's new leader,
read_committed consumers (confluent-kafka and kafka-python) never see half of it, and the last
stable offset is right on the new leader: held back while the transaction is open, at the high
watermark once it is done."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from read_to_end import read_to_end

from automq.broker.kafka.groups.state import partition_for

pytestmark = pytest.mark.slow

TXN_TOPIC = "__transaction_state"


@pytest.fixture(scope="module")
def moves_cluster(tmp_path_factory, e2e):
    with e2e.running_cluster(tmp_path_factory.mktemp("txn-moves")) as c:
        yield c


def _leader(bootstrap: str, topic: str, partition: int) -> int:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return md.topics[topic].partitions[partition].leader


def _move(bootstrap: str, topic: str, partition: int, target: int, timeout: float = 60.0) -> None:
    """Reassign the partition to broker `target` and wait until metadata names it leader."""
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","), request_timeout_ms=30_000)
    try:
        admin.alter_partition_reassignments({KTopicPartition(topic, partition): [target]}, timeout_ms=30_000)
    finally:
        admin.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _leader(bootstrap, topic, partition) == target:
            return
        time.sleep(0.2)
    raise AssertionError(f"{topic}-{partition} was not moved to broker {target} within {timeout:.0f}s")


def _other(broker: int) -> int:
    return 2 if broker == 1 else 1


def _offsets(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    """(last stable offset, high watermark) as ListOffsets answers them (kafka-python)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    tp = KTopicPartition(topic, partition)
    out = []
    for level in ("read_committed", "read_uncommitted"):
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=level, request_timeout_ms=30_000)
        try:
            out.append(consumer.end_offsets([tp])[tp])
        finally:
            consumer.close()
    return out[0], out[1]


def _read_committed_kafka_python(bootstrap: str, topic: str) -> list[bytes]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        consumer_timeout_ms=5_000,
    )
    try:
        return [m.value for m in consumer]
    finally:
        consumer.close()


def test_data_partition_moved_mid_transaction(moves_cluster, e2e):
    """confluent-kafka producer; partition 0 moves to the other broker between the
    transaction's first and last records, back during a second transaction that aborts, and
    away again while a third one commits."""
    c = moves_cluster
    topic = e2e.topic_name("txmove")
    e2e.create_topic(c.bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": topic, "linger.ms": 0})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, value=b"before", partition=0)
    producer.commit_transaction(60)
    first_in_txn = _offsets(c.bootstrap, topic, 0)[1]

    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=f"c-{i}".encode(), partition=i % 2)
    producer.flush(30)
    origin = _leader(c.bootstrap, topic, 0)
    _move(c.bootstrap, topic, 0, _other(origin))
    # the new leader knows the open transaction: the last stable offset stays at its start
    lso, hw = _offsets(c.bootstrap, topic, 0)
    assert (lso, hw) == (first_in_txn, first_in_txn + 5)
    assert read_to_end(c.bootstrap, topic, 2, timeout=60) == [b"before"]
    for i in range(10, 20):
        producer.produce(topic, value=f"c-{i}".encode(), partition=i % 2)
    producer.commit_transaction(60)
    lso, hw = _offsets(c.bootstrap, topic, 0)
    assert lso == hw == first_in_txn + 10 + 1  # 10 records and the commit marker, on the new leader

    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=f"a-{i}".encode(), partition=i % 2)
    producer.flush(30)
    _move(c.bootstrap, topic, 0, origin)
    for i in range(10, 20):
        producer.produce(topic, value=f"a-{i}".encode(), partition=i % 2)
    producer.flush(30)
    producer.abort_transaction(60)
    lso, hw = _offsets(c.bootstrap, topic, 0)
    assert lso == hw

    # a move racing the commit: the markers follow the partition to whichever broker leads it
    producer.begin_transaction()
    for i in range(20, 30):
        producer.produce(topic, value=f"c-{i}".encode(), partition=i % 2)
    producer.flush(30)
    mover = threading.Thread(target=_move, args=(c.bootstrap, topic, 0, _other(origin)))
    mover.start()
    producer.commit_transaction(60)
    mover.join(90)
    assert _leader(c.bootstrap, topic, 0) == _other(origin)
    lso, hw = _offsets(c.bootstrap, topic, 0)
    assert lso == hw

    committed = sorted(f"c-{i}".encode() for i in range(30))
    for seen in (read_to_end(c.bootstrap, topic, 2, timeout=60), _read_committed_kafka_python(c.bootstrap, topic)):
        assert sorted(v for v in seen if v != b"before") == committed
        assert b"before" in seen


def test_coordinator_partition_moved_mid_transaction(moves_cluster, e2e):
    """kafka-python transactional producer; the `__transaction_state` partition of its id moves
    while a transaction is open (it commits), and again while EndTxn is in flight (the
    transaction ends whole, whichever coordinator finishes it)."""
    from kafka import KafkaProducer

    c = moves_cluster
    topic = e2e.topic_name("coordmove")
    e2e.create_topic(c.bootstrap, topic, partitions=2)
    tid = f"tid-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=c.bootstrap, transactional_id=tid, max_block_ms=60_000)
    try:
        producer.init_transactions()
        state_partition = partition_for(tid, 8)
        e2e.wait_for_leaders(c.bootstrap, TXN_TOPIC, 8)

        producer.begin_transaction()
        for i in range(10):
            producer.send(topic, value=f"one-{i}".encode(), partition=i % 2)
        producer.flush()
        _move(c.bootstrap, TXN_TOPIC, state_partition, _other(_leader(c.bootstrap, TXN_TOPIC, state_partition)))
        for i in range(10, 20):
            producer.send(topic, value=f"one-{i}".encode(), partition=i % 2)
        producer.commit_transaction()
        for p in (0, 1):
            lso, hw = _offsets(c.bootstrap, topic, p)
            assert lso == hw

        producer.begin_transaction()
        for i in range(10):
            producer.send(topic, value=f"two-{i}".encode(), partition=i % 2)
        producer.flush()
        target = _other(_leader(c.bootstrap, TXN_TOPIC, state_partition))
        mover = threading.Thread(target=_move, args=(c.bootstrap, TXN_TOPIC, state_partition, target))
        mover.start()
        producer.commit_transaction()
        mover.join(90)
        assert _leader(c.bootstrap, TXN_TOPIC, state_partition) == target

        # the id keeps working with its new coordinator
        producer.begin_transaction()
        producer.send(topic, value=b"three", partition=0)
        producer.commit_transaction()
    finally:
        producer.close(timeout=10)
    for p in (0, 1):
        lso, hw = _offsets(c.bootstrap, topic, p)
        assert lso == hw
    for seen in (read_to_end(c.bootstrap, topic, 2, timeout=60), _read_committed_kafka_python(c.bootstrap, topic)):
        assert sorted(seen) == sorted(
            [f"one-{i}".encode() for i in range(20)] + [f"two-{i}".encode() for i in range(10)] + [b"three"]
        )


def test_aborted_data_stays_hidden_after_its_partition_moves(moves_cluster, e2e):
    """Aborted ranges move with the partition: an aborted transaction's records, written
    before the move, stay invisible to read_committed readers of the new leader (they need
    the aborted-transaction index from the producer snapshot), while read_uncommitted sees them."""
    c = moves_cluster
    topic = e2e.topic_name("abmove")
    e2e.create_topic(c.bootstrap, topic, partitions=1)
    producer = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": topic})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted")
    producer.flush(30)
    producer.abort_transaction(60)
    producer.begin_transaction()
    producer.produce(topic, value=b"kept")
    producer.commit_transaction(60)
    _move(c.bootstrap, topic, 0, _other(_leader(c.bootstrap, topic, 0)))
    assert read_to_end(c.bootstrap, topic, 1, timeout=60) == [b"kept"]
    assert _read_committed_kafka_python(c.bootstrap, topic) == [b"kept"]
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "u", "isolation.level": "read_uncommitted"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30, cached=False)
    finally:
        consumer.close()
    assert (low, high) == (0, 4)  # two records, two markers


def test_partition_moved_while_a_transaction_is_producing(moves_cluster, e2e):
    """Records in flight (librdkafka keeps up to 5 requests per broker in flight) while their
    partition moves: retried on the new leader under the same sequence numbers, each record
    lands once, and the committed transaction is whole."""
    c = moves_cluster
    topic = e2e.topic_name("flight")
    e2e.create_topic(c.bootstrap, topic, partitions=1)
    producer = Producer(
        {"bootstrap.servers": c.bootstrap, "transactional.id": topic, "linger.ms": 2, "batch.num.messages": 50}
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    origin = _leader(c.bootstrap, topic, 0)
    mover = threading.Thread(target=_move, args=(c.bootstrap, topic, 0, _other(origin)))
    for i in range(3000):
        if i == 500:
            mover.start()
        while True:
            try:
                producer.produce(topic, value=f"f-{i}".encode())
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    mover.join(90)
    producer.commit_transaction(120)
    assert _leader(c.bootstrap, topic, 0) == _other(origin)
    lso, hw = _offsets(c.bootstrap, topic, 0)
    assert lso == hw
    seen = _read_committed_kafka_python(c.bootstrap, topic)
    assert len(seen) == 3000 and sorted(seen) == sorted(f"f-{i}".encode() for i in range(3000))
