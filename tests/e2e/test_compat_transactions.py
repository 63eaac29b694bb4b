"""Transactions and read_committed with every client that has them, on the shared 2-broker
cluster (transactions span partitions led by both brokers, the coordinator on either):
confluent-kafka (librdkafka), kafka-python, aiokafka, and kcat as a read_committed reader.

Committed transactions are visible to read_committed consumers, aborted ones never are (they
stay visible to read_uncommitted ones, as in Kafka); consume-transform-produce with the
offsets in the transaction processes every input exactly once across an abort; a second
producer with the same transactional id fences the first and aborts its open transaction; a
transaction left open past its timeout is aborted by the coordinator."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from read_to_end import read_to_end


def _three_transactions(send, begin, commit, abort, flush=lambda: None) -> None:
    """txn 0 committed, txn 1 aborted, txn 2 committed; 10 records each."""
    for txn, committed in ((0, True), (1, False), (2, True)):
        begin()
        for i in range(10):
            send(str(i).encode(), f"{txn}-{i}".encode())
        if committed:
            commit()
        else:
            flush()  # the aborted records really reach the partitions first
            abort()


def _txns_seen(values: list[bytes]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        txn = v.decode().split("-")[0]
        out[txn] = out.get(txn, 0) + 1
    return out


def test_confluent_commit_and_abort_across_partitions(cluster, e2e):
    topic = e2e.topic_name("txn")
    e2e.create_topic(cluster.bootstrap, topic, partitions=4)
    leaders = e2e.wait_for_leaders(cluster.bootstrap, topic, 4)
    assert len(set(leaders.values())) == 2, "the topic should span both brokers"
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": topic})
    producer.init_transactions(60)
    _three_transactions(
        lambda k, v: producer.produce(topic, key=k, value=v),
        producer.begin_transaction,
        lambda: producer.commit_transaction(60),
        lambda: producer.abort_transaction(60),
        producer.flush,
    )
    assert _txns_seen(read_to_end(cluster.bootstrap, topic, 4, "read_committed")) == {"0": 10, "2": 10}
    assert _txns_seen(read_to_end(cluster.bootstrap, topic, 4, "read_uncommitted")) == {"0": 10, "1": 10, "2": 10}


def test_open_transaction_holds_back_read_committed_and_list_offsets(cluster, e2e):
    topic = e2e.topic_name("lso")
    e2e.create_topic(cluster.bootstrap, topic, partitions=1)
    plain = Producer({"bootstrap.servers": cluster.bootstrap})
    txn = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": topic})
    txn.init_transactions(60)
    plain.produce(topic, value=b"before")
    plain.flush(30)
    txn.begin_transaction()
    txn.produce(topic, value=b"in-txn")
    txn.flush(30)
    plain.produce(topic, value=b"after")  # behind the open transaction: not stable yet
    plain.flush(30)

    def high(level: str) -> int:
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "w", "isolation.level": level})
        try:
            return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30, cached=False)[1]
        finally:
            c.close()

    assert high("read_uncommitted") == 3
    assert high("read_committed") == 1  # ListOffsets LATEST = the last stable offset
    assert read_to_end(cluster.bootstrap, topic, 1, "read_committed") == [b"before"]
    txn.commit_transaction(60)
    assert high("read_committed") == 4  # the marker is an offset too
    assert read_to_end(cluster.bootstrap, topic, 1, "read_committed") == [b"before", b"in-txn", b"after"]


@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])  # consumer: KIP-848 member epochs
def test_confluent_consume_transform_produce_exactly_once(cluster, e2e, group_protocol):
    src, dst = e2e.topic_name("src"), e2e.topic_name("dst")
    e2e.create_topic(cluster.bootstrap, src, partitions=2)
    e2e.create_topic(cluster.bootstrap, dst, partitions=2)
    e2e.produce(cluster.bootstrap, src, [str(i).encode() for i in range(200)])
    group = f"ctp-{src}"
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "group.protocol": group_protocol,
        }
    )
    consumer.subscribe([src])
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": f"ctp-{src}"})
    producer.init_transactions(60)
    processed, rounds, aborted = 0, 0, 0
    deadline = time.monotonic() + 120
    try:
        while processed < 200 and time.monotonic() < deadline:
            msgs = [m for m in consumer.consume(20, 1.0) if not m.error()]
            if not msgs:
                continue
            producer.begin_transaction()
            for m in msgs:
                producer.produce(dst, key=m.key(), value=b"out-" + m.value())
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 60
            )
            rounds += 1
            if rounds in (2, 5):  # abort some rounds: their output and offsets must vanish
                producer.flush(60)  # (librdkafka's abort drops what it has not sent yet)
                producer.abort_transaction(60)
                aborted += 1
                for tp in consumer.committed(consumer.assignment(), 30):
                    consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
                continue
            producer.commit_transaction(60)
            processed += len(msgs)
        committed = consumer.committed(consumer.assignment(), 30)
    finally:
        consumer.close()
    assert processed == 200 and aborted == 2
    assert sum(tp.offset for tp in committed) == 200  # the group's offsets came with the transactions
    out = read_to_end(cluster.bootstrap, dst, 2, "read_committed")
    assert sorted(out) == sorted(b"out-" + str(i).encode() for i in range(200))  # each exactly once
    assert len(read_to_end(cluster.bootstrap, dst, 2, "read_uncommitted")) > 200  # the aborted output is there


def test_second_instance_fences_the_first_and_aborts_its_transaction(cluster, e2e):
    topic = e2e.topic_name("zombie")
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)
    config = {"bootstrap.servers": cluster.bootstrap, "transactional.id": topic}
    zombie = Producer(config)
    zombie.init_transactions(60)
    zombie.begin_transaction()
    for i in range(5):
        zombie.produce(topic, value=f"zombie-{i}".encode())
    zombie.flush(30)
    successor = Producer(config)
    successor.init_transactions(60)  # waits out the abort of the zombie's transaction
    successor.begin_transaction()
    successor.produce(topic, value=b"successor")
    successor.commit_transaction(60)
    with pytest.raises(KafkaException) as info:
        zombie.produce(topic, value=b"late")
        zombie.commit_transaction(30)
    err = info.value.args[0]
    assert err.fatal() or err.txn_requires_abort(), err
    assert read_to_end(cluster.bootstrap, topic, 2, "read_committed") == [b"successor"]


def test_transaction_left_open_is_aborted_after_its_timeout(cluster, e2e):
    topic = e2e.topic_name("timeout")
    e2e.create_topic(cluster.bootstrap, topic, partitions=1)
    stuck = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": topic, "transaction.timeout.ms": 2000}
    )
    stuck.init_transactions(60)
    stuck.begin_transaction()
    stuck.produce(topic, value=b"never")
    stuck.flush(30)
    e2e.produce(cluster.bootstrap, topic, [b"plain"])
    # the coordinator aborts the transaction (checked every second in this cluster): the
    # plain record behind it becomes readable for read_committed, the transaction's is not
    deadline = time.monotonic() + 60
    seen: list[bytes] = []
    while time.monotonic() < deadline and seen != [b"plain"]:
        seen = read_to_end(cluster.bootstrap, topic, 1, "read_committed")
        time.sleep(0.5)
    assert seen == [b"plain"]
    with pytest.raises(KafkaException):
        stuck.commit_transaction(30)


def test_kafka_python_transactions_and_read_committed(cluster, e2e):
    from kafka import KafkaConsumer, KafkaProducer

    topic = e2e.topic_name("kp-txn")
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=topic, max_block_ms=60_000)
    try:
        producer.init_transactions()
        _three_transactions(
            lambda k, v: producer.send(topic, key=k, value=v),
            producer.begin_transaction,
            producer.commit_transaction,
            producer.abort_transaction,
            producer.flush,
        )
    finally:
        producer.close(timeout=10)
    for level, expected in (("read_committed", {"0": 10, "2": 10}), ("read_uncommitted", {"0": 10, "1": 10, "2": 10})):
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=cluster.bootstrap,
            auto_offset_reset="earliest",
            isolation_level=level,
            consumer_timeout_ms=5_000,
        )
        try:
            assert _txns_seen([m.value for m in consumer]) == expected, level
        finally:
            consumer.close()


def test_aiokafka_transactions_offsets_and_read_committed(cluster, e2e):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = e2e.topic_name("aio-txn")
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)
    group = f"aio-{topic}"

    async def run() -> dict[str, dict[str, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=topic)
        await producer.start()
        try:
            for txn, committed in ((0, True), (1, False), (2, True)):
                await producer.begin_transaction()
                for i in range(10):
                    await producer.send(topic, key=str(i).encode(), value=f"{txn}-{i}".encode())
                # offsets in the transaction: the group's offset becomes txn's number
                from aiokafka import TopicPartition as AioTP

                await producer.send_offsets_to_transaction({AioTP(topic, 0): txn + 100}, group)
                if committed:
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
        finally:
            await producer.stop()
        seen = {}
        for level in ("read_committed", "read_uncommitted"):
            consumer = AIOKafkaConsumer(
                topic, bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest", isolation_level=level
            )
            await consumer.start()
            values: list[bytes] = []
            try:
                while True:
                    batch = await consumer.getmany(timeout_ms=3_000)
                    if not batch:
                        break
                    for msgs in batch.values():
                        values += [m.value for m in msgs]
            finally:
                await consumer.stop()
            seen[level] = _txns_seen(values)
        return seen

    seen = asyncio.run(run())
    assert seen == {"read_committed": {"0": 10, "2": 10}, "read_uncommitted": {"0": 10, "1": 10, "2": 10}}
    reader = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    try:
        committed = reader.committed([TopicPartition(topic, 0)], 30)
    finally:
        reader.close()
    assert committed[0].offset == 102  # the last committed transaction's offset, not the aborted one's


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_read_committed(cluster, e2e):
    topic = e2e.topic_name("kcat-txn")
    e2e.create_topic(cluster.bootstrap, topic, partitions=1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": topic})
    producer.init_transactions(60)
    _three_transactions(
        lambda k, v: producer.produce(topic, key=k, value=v),
        producer.begin_transaction,
        lambda: producer.commit_transaction(60),
        lambda: producer.abort_transaction(60),
        producer.flush,
    )

    def kcat(level: str) -> list[bytes]:
        out = subprocess.run(
            [
                "kcat",
                "-C",
                "-b",
                cluster.bootstrap,
                "-t",
                topic,
                "-e",
                "-q",
                "-f",
                "%s\\n",
                "-X",
                f"isolation.level={level}",
            ],
            capture_output=True,
            timeout=60,
            check=True,
        )
        return out.stdout.split()

    assert _txns_seen(kcat("read_committed")) == {"0": 10, "2": 10}
    assert _txns_seen(kcat("read_uncommitted")) == {"0": 10, "1": 10, "2": 10}
