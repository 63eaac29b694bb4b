"""The `automq` data source against a real cluster: what Spark reads from the object store
equals what a Kafka consumer reads from the brokers, for every codec, both client libraries,
keys, headers and null values."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def _records(n: int, partitions: int, tag: str) -> list[tuple]:
    out = []
    for i in range(n):
        key = None if i % 7 == 0 else f"k{i % 13}".encode()
        value = None if i % 11 == 5 and key is not None else f'{{"i": {i}, "tag": "{tag}"}}'.encode()
        headers = [("h", f"v{i}".encode()), ("empty", None)] if i % 3 == 0 else []
        out.append((key, value, headers, i % partitions))
    return out


def _rows(df) -> list[tuple]:
    rows = df.orderBy("partition", "offset").collect()
    return [
        (
            r.partition,
            r.offset,
            int(r.timestamp.timestamp() * 1000 + 0.5),
            None if r.key is None else bytes(r.key),
            None if r.value is None else bytes(r.value),
            [(h.key, None if h.value is None else bytes(h.value)) for h in (r.headers or [])],
        )
        for r in rows
    ]


def test_every_codec_and_client_reads_like_a_consumer(spark, spark_cluster, sh):
    topic = sh.topic_name("codecs")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2)
    total = 0
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        recs = _records(150, 2, f"c-{codec}")
        sh.produce_confluent(spark_cluster.bootstrap, topic, recs, **{"compression.type": codec})
        total += len(recs)
    for codec in (None, "gzip", "snappy", "lz4", "zstd"):
        recs = _records(100, 2, f"p-{codec}")
        sh.produce_kafka_python(spark_cluster.bootstrap, topic, recs, compression_type=codec)
        total += len(recs)
    spark_cluster.wait_uploaded(topic, total)

    df = (
        spark.read.format("automq")
        .option("topic", topic)
        .option("controller", spark_cluster.controller_url)
        .option("objectStore", spark_cluster.object_store_url)
        .load()
    )
    got = _rows(df)
    expected = sh.consume_all(spark_cluster.bootstrap, topic, total)
    assert len(expected) == total
    assert got == expected
    assert {r.topic for r in df.select("topic").distinct().collect()} == {topic}
    # keys, null keys, null values and headers all occurred
    assert any(r[3] is None for r in got) and any(r[4] is None for r in got) and any(r[5] for r in got)


def test_offsets_options_and_metadata_from_the_store(spark, spark_cluster, sh):
    topic = sh.topic_name("ranges")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=1)
    sh.produce_confluent(spark_cluster.bootstrap, topic, [(b"k", str(i).encode(), [], 0) for i in range(300)])
    spark_cluster.wait_uploaded(topic, 300)
    # no controller: the metadata log in the object store is the plan's source
    df = (
        spark.read.format("automq")
        .option("topic", topic)
        .option("objectStore", spark_cluster.object_store_url)
        .option("startingOffsets", f'{{"{topic}": {{"0": 120}}}}')
        .option("endingOffsets", f'{{"{topic}": {{"0": 250}}}}')
        .option("maxBytesPerPartition", "1")
        .load()
    )
    offsets = [r.offset for r in df.orderBy("offset").collect()]
    assert offsets == list(range(120, 250))
    assert [bytes(r.value) for r in df.orderBy("offset").collect()] == [str(i).encode() for i in range(120, 250)]


def test_bad_options_name_the_option(spark, spark_cluster):
    from pyspark.errors import PySparkException

    def reader():  # DataFrameReader.option mutates: a fresh one per case
        return spark.read.format("automq").option("objectStore", spark_cluster.object_store_url)

    with pytest.raises(PySparkException, match='needs option "topic"'):
        reader().load().collect()
    with pytest.raises(PySparkException, match="option startingOffsets"):
        reader().option("topic", "x").option("startingOffsets", "{nope").load().collect()
    with pytest.raises(PySparkException, match="no-such-topic-here do not exist"):
        reader().option("topic", "no-such-topic-here").load().collect()
    with pytest.raises(PySparkException, match="no object store"):
        spark.read.format("automq").option("topic", "x").load().collect()


def test_bulk_reads_give_every_core_a_task_but_not_tiny_ones():
    from automq.spark.bulkread import MIN_TASK_BYTES, task_groups
    from automq.spark.reader import ObjectSlice

    slices = [ObjectSlice(i, 1 << 20, 7, i * 100, (i + 1) * 100) for i in range(32)]  # 32 MiB in 1 MiB objects
    groups = task_groups(slices, 2, 64 << 20)
    assert [len(g) for g in groups] == [16, 16] and [sl for g in groups for sl in g] == slices
    assert len(task_groups(slices, 64, 64 << 20)) == 32 // (MIN_TASK_BYTES >> 20)
    # 320 MiB: 5 tasks of 64 MiB would leave one core a second wave; 6 even ones do not
    many = [ObjectSlice(i, 1 << 20, 7, i * 100, (i + 1) * 100) for i in range(320)]
    groups = task_groups(many, 2, 64 << 20)
    assert len(groups) == 6 and {len(g) for g in groups} <= {53, 54} and [sl for g in groups for sl in g] == many
    assert task_groups([], 2, 64 << 20) == []
