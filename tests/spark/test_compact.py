"""Object compaction against a real cluster: many small uploads become a few stream
objects, consumers from offset 0 read byte-identical data before and after while a
producer keeps writing, a racing second job and a trim both make a commit lose cleanly."""

from __future__ import annotations

import asyncio
import threading

import pytest

from automq.spark.cluster import ClusterLocation, ClusterView
from automq.spark.compact import CompactionSettings, compact, plan_async

pytestmark = [pytest.mark.slow, pytest.mark.spark]

NOW = CompactionSettings(min_age_ms=0, target_bytes=64 << 20)


def _objects(location, topic: str, partition: int = 0) -> set[int]:
    p = ClusterView.load(location, [topic]).topic(topic).partitions[partition]
    return {obj.object_id for obj, _, _ in p.ranges()}


def _fill(sh, cluster, topic: str, rounds: int, per_round: int = 300) -> int:
    """Small uploads: the cluster uploads every 256 KiB / 0.5 s; each round is ~300 KiB."""
    n = 0
    for r in range(rounds):
        recs = [(f"k{i}".encode(), bytes([r % 256]) * 1000, [("r", str(r).encode())], 0) for i in range(per_round)]
        n += len(recs)
        sh.produce_confluent(cluster.bootstrap, topic, recs, **{"compression.type": "lz4" if r % 2 else "none"})
    cluster.wait_uploaded(topic, n)
    return n


def test_compaction_merges_small_objects_while_producing(spark, spark_cluster, sh):
    topic = sh.topic_name("compact")
    sh.create_topic(spark_cluster.bootstrap, topic)
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    n = _fill(sh, spark_cluster, topic, 30)
    before_objects = _objects(location, topic)
    assert len(before_objects) >= 15, f"expected many small objects, got {len(before_objects)}"
    before = sh.consume_all(spark_cluster.bootstrap, topic, n)
    assert len(before) == n

    stop = threading.Event()

    def producer():
        while not stop.is_set():
            sh.produce_confluent(spark_cluster.bootstrap, topic, [(b"late", b"x" * 100, [], 0)] * 50)

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    try:
        report = compact(spark, location, NOW)
    finally:
        stop.set()
        thread.join(60)
    assert report.committed >= 1 and not report.errors, report
    after_objects = _objects(location, topic)
    # the compacted prefix [0, n) now lives in far fewer objects
    p = ClusterView.load(location, [topic]).topic(topic).partitions[0]
    prefix = {obj.object_id for obj, start, _ in p.ranges() if start < n}
    assert len(before_objects) >= 10 * len(prefix), (len(before_objects), prefix)
    assert not (before_objects & after_objects) or len(after_objects) < len(before_objects)

    after = sh.consume_all(spark_cluster.bootstrap, topic, n)[:n]
    assert after == before  # offsets, timestamps, keys, values, headers: byte-identical
    df = (
        spark.read.format("automq")
        .option("topic", topic)
        .option("dataDir", str(spark_cluster.data_dir))
        .option("endingOffsets", f'{{"{topic}": {{"0": {n}}}}}')
        .load()
    )
    assert [(r.offset, bytes(r.value)) for r in df.orderBy("offset").collect()] == [
        (o, v) for _, o, _, _, v, _ in before
    ]


def test_a_racing_job_and_a_trim_lose_cleanly(spark, spark_cluster, sh):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = sh.topic_name("race")
    sh.create_topic(spark_cluster.bootstrap, topic)
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    n = _fill(sh, spark_cluster, topic, 8)
    tasks = [t for t in asyncio.run(plan_async(location, NOW)) if t.topic == topic]
    assert tasks
    first = compact(spark, location, NOW, tasks=tasks)
    second = compact(spark, location, NOW, tasks=tasks)  # planned before the first committed
    assert (first.committed, first.lost) == (len(tasks), 0)
    assert (second.committed, second.lost) == (0, len(tasks)) and not second.errors
    assert len(sh.consume_all(spark_cluster.bootstrap, topic, n)) == n

    # a compaction planned before a trim that deletes everything it would rewrite
    n += _fill(sh, spark_cluster, topic, 6)
    tasks = [t for t in asyncio.run(plan_async(location, NOW)) if t.topic == topic]
    assert tasks
    admin = AdminClient({"bootstrap.servers": spark_cluster.bootstrap})
    futures = admin.delete_records([TopicPartition(topic, 0, n)])
    for f in futures.values():
        f.result(30)
    report = compact(spark, location, NOW, tasks=tasks)
    assert report.committed == 0 and report.lost == len(tasks) and not report.errors
