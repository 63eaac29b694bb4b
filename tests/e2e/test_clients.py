"""Four real Kafka clients each produce and consume against the shared local cluster:
kafka-python, confluent-kafka (librdkafka), aiokafka and kcat."""

import asyncio
import shutil
import subprocess
import time
import uuid

import pytest

pytestmark = pytest.mark.slow

N = 300


def test_kafka_python_produce_consume(cluster, e2e):
    from kafka import KafkaConsumer, KafkaProducer

    topic = e2e.topic_name("kp")
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=5)
    futures = [producer.send(topic, key=str(i).encode(), value=f"kp-{i}".encode()) for i in range(N)]
    producer.flush(60)
    metas = [f.get(timeout=60) for f in futures]
    producer.close()
    # offsets are dense per partition
    by_partition: dict[int, list[int]] = {}
    for m in metas:
        by_partition.setdefault(m.partition, []).append(m.offset)
    for offsets in by_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=cluster.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=20_000,
    )
    values = set()
    for msg in consumer:
        values.add(msg.value)
        if len(values) == N:
            break
    consumer.close()
    assert values == {f"kp-{i}".encode() for i in range(N)}


def test_confluent_produce_consume_with_headers_and_keys(cluster, e2e):
    topic = e2e.topic_name("ck")
    e2e.create_topic(cluster.bootstrap, topic, partitions=3)
    acked = e2e.produce(cluster.bootstrap, topic, [f"ck-{i}".encode() for i in range(N)], **{"compression.type": "lz4"})
    assert len(acked) == N
    msgs = e2e.consume(cluster.bootstrap, topic, N)
    assert sorted(m.value() for m in msgs) == sorted(f"ck-{i}".encode() for i in range(N))
    # same key -> same partition, order kept within the partition
    for m in msgs:
        assert m.value() == f"ck-{m.key().decode()}".encode()
    per_partition: dict[int, list[int]] = {}
    for m in msgs:
        per_partition.setdefault(m.partition(), []).append(m.offset())
    assert all(offsets == sorted(offsets) for offsets in per_partition.values())


def test_aiokafka_produce_consume(cluster, e2e):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = e2e.topic_name("ak")
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", compression_type="gzip")
        await producer.start()
        try:
            batch = [producer.send(topic, f"ak-{i}".encode(), key=str(i).encode()) for i in range(N)]
            sent = await asyncio.gather(*batch)
            await asyncio.gather(*sent)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        out: list[bytes] = []
        try:
            deadline = time.monotonic() + 60
            while len(out) < N and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=1000)
                for records in batches.values():
                    out.extend(r.value for r in records)
        finally:
            await consumer.stop()
        return out

    values = asyncio.run(run())
    assert sorted(values) == sorted(f"ak-{i}".encode() for i in range(N))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")
def test_kcat_produce_consume(cluster, e2e):
    topic = e2e.topic_name("kc")
    e2e.create_topic(cluster.bootstrap, topic, partitions=1)
    lines = [f"k{i}:kcat-{i}-{uuid.uuid4().hex[:6]}" for i in range(100)]
    subprocess.run(
        ["kcat", "-b", cluster.bootstrap, "-t", topic, "-P", "-K:", "-X", "acks=all"],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        timeout=60,
    )
    out = subprocess.run(
        [
            "kcat",
            "-b",
            cluster.bootstrap,
            "-t",
            topic,
            "-C",
            "-o",
            "beginning",
            "-e",
            "-c",
            str(len(lines)),
            "-f",
            "%k:%s\\n",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.splitlines() == lines
    # metadata listing names both brokers
    md = subprocess.run(
        ["kcat", "-b", cluster.bootstrap, "-L", "-t", topic], capture_output=True, text=True, check=True, timeout=30
    )
    assert "2 brokers:" in md.stdout


def test_consumer_sees_data_produced_to_other_broker(cluster, e2e):
    """A client bootstrapped on broker 2 reads what a client bootstrapped on broker 1 wrote."""
    topic = e2e.topic_name("x")
    e2e.create_topic(cluster.broker_bootstrap(1), topic, partitions=4)
    e2e.produce(cluster.broker_bootstrap(1), topic, [b"v%d" % i for i in range(80)])
    msgs = e2e.consume(cluster.broker_bootstrap(2), topic, 80)
    assert sorted(m.value() for m in msgs) == sorted(b"v%d" % i for i in range(80))
