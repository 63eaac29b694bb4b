"""Zombie fencing, transaction timeouts and consume-transform-produce with kafka-python and
aiokafka (confluent-kafka's are in test_compat_transactions.py), on the shared 2-broker cluster.

A second producer with the same transactional id fences the first: its open transaction is
aborted (read_committed readers never see it) and its next commit fails with the client's
fencing error. A transaction left open past the producer's transaction.timeout.ms is aborted
by the coordinator: the records behind it become readable for read_committed, the stuck
producer's commit fails. A consume-transform-produce loop with the consumed offsets in each
transaction, some transactions aborted and their input read again from the group's committed
offsets, outputs every input exactly once (kafka-python passes the consumer's group metadata,
KIP-447; aiokafka the group id).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from read_to_end import read_to_end

CTP_INPUTS = 200


def _wait_read_committed(bootstrap: str, topic: str, expected: list[bytes], timeout: float = 60.0) -> None:
    """The coordinator's timeout check runs every second in this cluster: poll until it aborted."""
    deadline = time.monotonic() + timeout
    seen: list[bytes] = []
    while time.monotonic() < deadline:
        seen = read_to_end(bootstrap, topic, 1)
        if seen == expected:
            return
        time.sleep(0.5)
    assert seen == expected


# ---------------------------------------------------------------- kafka-python


def test_kafka_python_second_instance_fences_the_first(cluster, e2e):
    from kafka import KafkaProducer
    from kafka.errors import InvalidProducerEpochError, ProducerFencedError
    from kafka.errors import KafkaError as KafkaPythonError

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
        # The late batch is refused (INVALID_PRODUCER_EPOCH, as Kafka's partitions answer a
        # fenced epoch) and the EndTxn too (PRODUCER_FENCED); which of them kafka-python reports
        # depends on timing: if the batch's error comes first it tries an epoch bump, is told
        # PRODUCER_FENCED, and commit_transaction() fails on its own state machine instead.
        with pytest.raises(KafkaPythonError) as info:
            zombie.send(topic, value=b"late")
            zombie.commit_transaction()
        assert isinstance(
            info.value, (ProducerFencedError, InvalidProducerEpochError)
        ) or "BUMPING_PRODUCER_EPOCH" in str(info.value), info.value
    finally:
        zombie.close(timeout=10)
        if successor is not None:
            successor.close(timeout=10)
    assert read_to_end(cluster.bootstrap, topic, 2) == [b"successor"]


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


def test_kafka_python_consume_transform_produce_exactly_once(cluster, e2e):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.structs import OffsetAndMetadata

    src, dst = _ctp_topics(cluster, e2e, "kp")
    group = f"ctp-{src}"
    consumer = KafkaConsumer(
        src,
        bootstrap_servers=cluster.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=group, max_block_ms=60_000)
    processed, rounds, aborted = 0, 0, 0
    deadline = time.monotonic() + 120
    try:
        producer.init_transactions()
        while processed < CTP_INPUTS and time.monotonic() < deadline:
            msgs = [m for ms in consumer.poll(timeout_ms=1000, max_records=20).values() for m in ms]
            if not msgs:
                continue
            producer.begin_transaction()
            for m in msgs:
                producer.send(dst, key=m.key, value=b"out-" + m.value)
            offsets = {tp: OffsetAndMetadata(consumer.position(tp), "", -1) for tp in consumer.assignment()}
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            rounds += 1
            if rounds in (2, 5):  # aborted: their output and offsets must vanish
                producer.flush()
                producer.abort_transaction()
                aborted += 1
                for tp in consumer.assignment():
                    offset = consumer.committed(tp)
                    if offset is None:
                        consumer.seek_to_beginning(tp)
                    else:
                        consumer.seek(tp, offset)
                continue
            producer.commit_transaction()
            processed += len(msgs)
        committed = [consumer.committed(tp) or 0 for tp in consumer.assignment()]
    finally:
        producer.close(timeout=10)
        consumer.close()
    _assert_ctp(cluster, dst, processed, aborted, committed)


def _ctp_topics(cluster, e2e, prefix: str) -> tuple[str, str]:
    src, dst = e2e.topic_name(f"{prefix}-src"), e2e.topic_name(f"{prefix}-dst")
    e2e.create_topic(cluster.bootstrap, src, partitions=2)
    e2e.create_topic(cluster.bootstrap, dst, partitions=2)
    e2e.produce(cluster.bootstrap, src, [str(i).encode() for i in range(CTP_INPUTS)])
    return src, dst


def _assert_ctp(cluster, dst: str, processed: int, aborted: int, committed: list[int]) -> None:
    assert processed == CTP_INPUTS and aborted == 2
    assert sum(committed) == CTP_INPUTS  # the group's offsets came with the transactions
    out = read_to_end(cluster.bootstrap, dst, 2)
    assert sorted(out) == sorted(b"out-" + str(i).encode() for i in range(CTP_INPUTS))  # each exactly once
    assert len(read_to_end(cluster.bootstrap, dst, 2, level="read_uncommitted")) > CTP_INPUTS  # aborted output


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
    assert read_to_end(cluster.bootstrap, topic, 2) == [b"successor"]


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


def test_aiokafka_consume_transform_produce_exactly_once(cluster, e2e):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    src, dst = _ctp_topics(cluster, e2e, "aio")
    group = f"ctp-{src}"

    async def run() -> tuple[int, int, list[int]]:
        consumer = AIOKafkaConsumer(
            src,
            bootstrap_servers=cluster.bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=group)
        await consumer.start()
        await producer.start()
        processed, rounds, aborted = 0, 0, 0
        deadline = time.monotonic() + 120
        try:
            while processed < CTP_INPUTS and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=1000, max_records=20)
                msgs = [m for ms in batch.values() for m in ms]
                if not msgs:
                    continue
                await producer.begin_transaction()
                for m in msgs:
                    await producer.send(dst, key=m.key, value=b"out-" + m.value)
                offsets = {tp: await consumer.position(tp) for tp in consumer.assignment()}
                await producer.send_offsets_to_transaction(offsets, group)
                rounds += 1
                if rounds in (2, 5):
                    await producer.flush()
                    await producer.abort_transaction()
                    aborted += 1
                    for tp in consumer.assignment():
                        offset = await consumer.committed(tp)
                        if offset is None:
                            await consumer.seek_to_beginning(tp)
                        else:
                            consumer.seek(tp, offset)
                    continue
                await producer.commit_transaction()
                processed += len(msgs)
            committed = [await consumer.committed(tp) or 0 for tp in consumer.assignment()]
        finally:
            await producer.stop()
            await consumer.stop()
        return processed, aborted, committed

    processed, aborted, committed = asyncio.run(asyncio.wait_for(run(), 180))
    _assert_ctp(cluster, dst, processed, aborted, committed)
