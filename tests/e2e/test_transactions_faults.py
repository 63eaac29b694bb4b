"""Transactions through broker deaths (own cluster: the tests kill -9 brokers; the launcher
restarts them). A transaction is never half visible to read_committed consumers: it commits
whole or aborts whole, and the last stable offset never stays stuck behind it."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from automq.broker.kafka.groups.state import partition_for

pytestmark = pytest.mark.slow

TXN_TOPIC = "__transaction_state"


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory, e2e):
    with e2e.running_cluster(tmp_path_factory.mktemp("txn-faults")) as c:
        yield c


def _leader(bootstrap: str, topic: str, partition: int) -> int:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return md.topics[topic].partitions[partition].leader


def _read_committed(bootstrap: str, topic: str, partitions: int, timeout: float = 120.0) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    out: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(eof) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                continue
            eof.discard(msg.partition())
            out.append(msg.value())
    finally:
        consumer.close()
    assert len(eof) == partitions, "read_committed did not reach the end (a stuck last stable offset?)"
    return out


def _kill_mid_transaction(cluster, e2e, choose_victim) -> None:
    tid = e2e.topic_name("tid")
    topic = e2e.topic_name("txk")
    e2e.create_topic(cluster.bootstrap, topic, partitions=4)
    leaders = e2e.wait_for_leaders(cluster.bootstrap, topic, 4)
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": tid, "transaction.timeout.ms": 60_000}
    )
    producer.init_transactions(120)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed-before", partition=0)
    producer.commit_transaction(120)  # makes sure __transaction_state exists and is placed
    coordinator = _leader(cluster.bootstrap, TXN_TOPIC, partition_for(tid, 8))
    victim = choose_victim(coordinator, leaders)

    producer.begin_transaction()
    for i in range(40):
        producer.produce(topic, value=f"txn-{i}".encode(), partition=i % 4)
    producer.flush(60)
    pid = cluster.kill9(f"broker-{victim}")
    outcome = "committed"
    try:
        producer.commit_transaction(120)
    except KafkaException as exc:
        err = exc.args[0]
        assert not err.fatal(), err
        producer.abort_transaction(120)
        outcome = "aborted"
    print(f"victim broker-{victim} (coordinator {coordinator}): the transaction {outcome}")
    cluster.wait_restarted(f"broker-{victim}", pid)
    seen = _read_committed(cluster.bootstrap, topic, 4)
    inside = sorted(v for v in seen if v.startswith(b"txn-"))
    if outcome == "committed":
        assert inside == sorted(f"txn-{i}".encode() for i in range(40))
    else:
        assert inside == []
    assert b"committed-before" in seen
    # the id still works after the failure
    producer.begin_transaction()
    producer.produce(topic, value=b"after", partition=1)
    producer.commit_transaction(120)
    assert b"after" in _read_committed(cluster.bootstrap, topic, 4)


def test_coordinator_killed_mid_transaction(own_cluster, e2e):
    _kill_mid_transaction(own_cluster, e2e, lambda coordinator, leaders: coordinator)


def test_data_partition_leader_killed_mid_transaction(own_cluster, e2e):
    def other(coordinator: int, leaders: dict[int, int]) -> int:
        others = [b for b in set(leaders.values()) if b != coordinator]
        return others[0] if others else coordinator

    _kill_mid_transaction(own_cluster, e2e, other)
