"""Key compaction of a cleanup.policy=compact topic against a real cluster: the latest
record per key survives with its original offset, old tombstones go, young records and
records under min.compaction.lag.ms stay; confluent-kafka, kafka-python and aiokafka all
read the compacted partition from offset 0."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from automq.spark.cluster import ClusterLocation
from automq.spark.keycompact import compact_keys

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def _kafka_python(bootstrap: str, topic: str, expected: int) -> list[tuple]:
    from kafka import KafkaConsumer

    c = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=f"kp-{uuid.uuid4().hex[:6]}",
        consumer_timeout_ms=10_000,
    )
    out = []
    try:
        for m in c:
            out.append((m.offset, m.key, m.value))
            if len(out) >= expected:
                break
    finally:
        c.close()
    return out


async def _aiokafka(bootstrap: str, topic: str, expected: int) -> list[tuple]:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=f"ak-{uuid.uuid4().hex[:6]}",
    )
    await c.start()
    out = []
    try:
        while len(out) < expected:
            batch = await asyncio.wait_for(c.getmany(timeout_ms=1000), 30)
            for msgs in batch.values():
                out += [(m.offset, m.key, m.value) for m in msgs]
            if not batch and out:
                break
    finally:
        await c.stop()
    return out


def test_latest_per_key_with_original_offsets_for_every_client(spark, spark_cluster, sh):
    topic = sh.topic_name("compacted")
    sh.create_topic(spark_cluster.bootstrap, topic, configs={"cleanup.policy": "compact", "delete.retention.ms": "0"})
    records = []
    for rnd in range(4):
        for k in range(10):
            records.append((f"k{k}".encode(), f"v{k}-{rnd}".encode(), [("round", str(rnd).encode())], 0))
    records.append((b"k3", None, [], 0))  # tombstone: k3 goes entirely
    records.append((b"k5", b"v5-last", [], 0))
    n = len(records)
    sh.produce_confluent(spark_cluster.bootstrap, topic, records[: n // 2], **{"compression.type": "zstd"})
    sh.produce_confluent(spark_cluster.bootstrap, topic, records[n // 2 :])
    spark_cluster.wait_uploaded(topic, n)
    before = sh.consume_all(spark_cluster.bootstrap, topic, n)
    assert len(before) == n

    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    report = compact_keys(spark, location, min_age_ms=0)
    assert report.committed >= 1 and not report.errors, report

    latest = {}
    for _p, offset, _ts, key, value, headers in before:
        latest[key] = (offset, value, headers)
    expected = sorted((o, k, v) for k, (o, v, _h) in latest.items() if v is not None)
    assert len(expected) == 9  # k3 deleted

    # the objects hold the compacted log ...
    df = spark.read.format("automq").option("topic", topic).option("dataDir", str(spark_cluster.data_dir)).load()
    rows = df.orderBy("offset").collect()
    assert [(r.offset, bytes(r.key), None if r.value is None else bytes(r.value)) for r in rows] == expected
    # ... and the broker, which still holds the old batches in its log cache, stops serving
    # them as soon as the controller's metadata says the range was rewritten: no restart
    deadline = time.monotonic() + 60
    while True:
        got = [
            (o, k, v)
            for _p, o, _ts, k, v, _h in sh.consume_all(spark_cluster.bootstrap, topic, len(expected), timeout=60)
        ]
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # the broker's metadata long-poll has not delivered the swap yet
    assert got == expected
    # headers and timestamps of survivors are the originals
    after_full = sh.consume_all(spark_cluster.bootstrap, topic, len(expected), timeout=30)
    by_offset = {r[1]: r for r in before}
    assert all(r == by_offset[r[1]] for r in after_full)
    assert _kafka_python(spark_cluster.bootstrap, topic, len(expected)) == expected
    assert asyncio.run(_aiokafka(spark_cluster.bootstrap, topic, len(expected))) == expected

    # new records after compaction continue at the next offset; a second run keeps them
    sh.produce_confluent(spark_cluster.bootstrap, topic, [(b"k0", b"v0-new", [], 0)])
    spark_cluster.wait_uploaded(topic, n + 1)
    compact_keys(spark, location, min_age_ms=0)
    df = spark.read.format("automq").option("topic", topic).option("dataDir", str(spark_cluster.data_dir)).load()
    final = [(r.offset, bytes(r.key), bytes(r.value)) for r in df.orderBy("offset").collect()]
    assert final == sorted([e for e in expected if e[1] != b"k0"] + [(n, b"k0", b"v0-new")])


def test_min_compaction_lag_and_delete_retention_are_honoured(spark, spark_cluster, sh):
    topic = sh.topic_name("lagged")
    sh.create_topic(
        spark_cluster.bootstrap, topic, configs={"cleanup.policy": "compact", "min.compaction.lag.ms": str(3_600_000)}
    )
    recs = [(b"a", b"1", [], 0), (b"a", b"2", [], 0), (b"b", None, [], 0)]
    sh.produce_confluent(spark_cluster.bootstrap, topic, recs)
    spark_cluster.wait_uploaded(topic, 3)
    compact_keys(spark, ClusterLocation.resolve(data_dir=spark_cluster.data_dir), min_age_ms=0)
    got = [(o, k, v) for _p, o, _ts, k, v, _h in sh.consume_all(spark_cluster.bootstrap, topic, 3, timeout=30)]
    assert got == [(0, b"a", b"1"), (1, b"a", b"2"), (2, b"b", None)]  # all younger than the lag
