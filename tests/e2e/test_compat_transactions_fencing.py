"""Zombie fencing and transaction timeouts with kafka-python and aiokafka (confluent-kafka's are
in test_compat_transactions.py), on the shared 2-broker cluster.

A second producer with the same transactional id fences the first: its open transaction is
aborted (read_committed readers never see it) and its next commit fails with the client's
fencing error. A transaction left open past the producer's transaction.timeout.ms is aborted
by the coordinator: the records behind it become readable for read_committed, the stuck
producer's commit fails.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError


def _read_committed(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
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
    assert len(eof) == partitions, f"read_committed did not reach the end of {topic} within {timeout}s"
    return out


def _wait_read_committed(bootstrap: str, topic: str, expected: list[bytes], timeout: float = 60.0) -> None:
    """The coordinator's timeout check runs every second in this cluster: poll until it aborted."""
    deadline = time.monotonic() + timeout
    seen: list[bytes] = []
    while time.monotonic() < deadline:
        seen = _read_committed(bootstrap, topic, 1)
        if seen == expected:
            return
        time.sleep(0.5)
    assert seen == expected


# ---------------------------------------------------------------- kafka-python


def test_kafka_python_second_instance_fences_the_first(cluster, e2e):
    from kafka import KafkaProducer
    from kafka.errors import InvalidProducerEpochError, ProducerFencedError

    topic = e2e.topic_name("kp-zombie")
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)

    def producer() -> KafkaProducer:
        return KafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=topic, max_block_ms=60_000)

    zombie = producer()
    successor = None
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        for i in range(5):
            zombie.send(topic, value=f"zombie-{i}".encode())
        zombie.flush()
        successor = producer()
        successor.init_transactions()  # waits out the abort of the zombie's transaction
        successor.begin_transaction()
        successor.send(topic, value=b"successor")
        successor.commit_transaction()
        with pytest.raises((ProducerFencedError, InvalidProducerEpochError)):
            zombie.send(topic, value=b"late")
            zombie.commit_transaction()
    finally:
        zombie.close(timeout=10)
        if successor is not None:
            successor.close(timeout=10)
    assert _read_committed(cluster.bootstrap, topic, 2) == [b"successor"]


def test_kafka_python_transaction_left_open_is_aborted_after_its_timeout(cluster, e2e):
    from kafka import KafkaProducer
    from kafka.errors import InvalidProducerEpochError, ProducerFencedError

    topic = e2e.topic_name("kp-timeout")
    e2e.create_topic(cluster.bootstrap, topic, partitions=1)
    stuck = KafkaProducer(
        bootstrap_servers=cluster.bootstrap, transactional_id=topic, transaction_timeout_ms=2000, max_block_ms=60_000
    )
    try:
        stuck.init_transactions()
        stuck.begin_transaction()
        stuck.send(topic, value=b"never")
        stuck.flush()
        e2e.produce(cluster.bootstrap, topic, [b"plain"])
        _wait_read_committed(cluster.bootstrap, topic, [b"plain"])
        # the abort bumped the epoch: the stuck instance is fenced, as with Kafka 4.x
        with pytest.raises((ProducerFencedError, InvalidProducerEpochError)):
            stuck.commit_transaction()
    finally:
        stuck.close(timeout=10)


# ---------------------------------------------------------------- aiokafka


def test_aiokafka_second_instance_fences_the_first(cluster, e2e):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import ProducerFenced

    topic = e2e.topic_name("aio-zombie")
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)

    async def run() -> None:
        zombie = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=topic)
        successor = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=topic)
        await zombie.start()
        try:
            await zombie.begin_transaction()
            for i in range(5):
                await zombie.send(topic, value=f"zombie-{i}".encode())
            await zombie.flush()
            await successor.start()  # InitProducerId: waits out the abort of the zombie's transaction
            async with successor.transaction():
                await successor.send(topic, value=b"successor")
            with pytest.raises(ProducerFenced):
                await zombie.send(topic, value=b"late")
                await zombie.commit_transaction()
        finally:
            await successor.stop()
            await zombie.stop()

    asyncio.run(asyncio.wait_for(run(), 120))
    assert _read_committed(cluster.bootstrap, topic, 2) == [b"successor"]


def test_aiokafka_transaction_left_open_is_aborted_after_its_timeout(cluster, e2e):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import ProducerFenced

    topic = e2e.topic_name("aio-timeout")
    e2e.create_topic(cluster.bootstrap, topic, partitions=1)

    async def run() -> None:
        stuck = AIOKafkaProducer(
            bootstrap_servers=cluster.bootstrap, transactional_id=topic, transaction_timeout_ms=2000
        )
        await stuck.start()
        try:
            await stuck.begin_transaction()
            await stuck.send(topic, value=b"never")
            await stuck.flush()
            e2e.produce(cluster.bootstrap, topic, [b"plain"])
            await asyncio.to_thread(_wait_read_committed, cluster.bootstrap, topic, [b"plain"])
            with pytest.raises(ProducerFenced):  # the abort bumped the epoch
                await stuck.commit_transaction()
        finally:
            await stuck.stop()

    asyncio.run(asyncio.wait_for(run(), 120))
