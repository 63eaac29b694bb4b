"""The `automq` data source against a real cluster: what Spark reads from the object store
equals what a Kafka consumer reads from the brokers, for every codec, both client libraries,
keys, headers and null values."""

from __future__ import annotations

import pytest

from automq.spark.reader import ObjectSlice

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


def test_bulk_read_tasks_take_whole_objects_so_each_tail_is_read_once():
    from automq.spark.bulkread import task_groups
    from automq.spark.source import with_lookahead

    # two partitions (streams 7 and 8) in the same 32 stream-set objects, planned stream by stream
    plan = [ObjectSlice(i, 1 << 20, sid, i * 100, (i + 1) * 100) for sid in (7, 8) for i in range(32)]
    groups = task_groups(plan, 2, 64 << 20)
    assert len(groups) == 2
    assert [sorted({sl.object_id for sl in g}) for g in groups] == [list(range(16)), list(range(16, 32))]
    for g in groups:  # both streams in each task, each stream's slices consecutive and in order
        assert [sl.stream_id for sl in g] == [7] * 16 + [8] * 16
        assert g == sorted(g, key=plan.index)
    # each task looks ahead into its streams' slices in the next task, not into the other stream
    first, second = with_lookahead(groups, plan)
    assert dict(first) == {7: tuple(plan[16:32]), 8: tuple(plan[48:64])}
    assert dict(second) == {7: (), 8: ()}


def test_bulk_read_tasks_keep_each_stream_in_offset_order_when_object_ids_are_not():
    from automq.spark.bulkread import task_groups

    # compaction wrote stream 7's first offsets into object 99, after objects 0-31 of later offsets
    plan = [ObjectSlice(99, 16 << 20, 7, 0, 1600)]
    plan += [ObjectSlice(i, 1 << 20, 7, 1600 + i * 100, 1700 + i * 100) for i in range(32)]
    plan += [ObjectSlice(i, 1 << 20, 8, i * 100, (i + 1) * 100) for i in range(32)]
    groups = task_groups(plan, 2, 64 << 20)
    assert sorted((sl for g in groups for sl in g), key=plan.index) == plan
    task_of = {id(sl): n for n, g in enumerate(groups) for sl in g}
    for sid in (7, 8):
        tasks = [task_of[id(sl)] for sl in plan if sl.stream_id == sid]
        assert tasks == sorted(tasks), "a stream's slices must go to the tasks in offset order"


def test_a_reader_fetches_each_objects_tail_once_for_all_its_partitions(spark_cluster, sh, monkeypatch):
    import asyncio
    from collections import Counter

    import pyarrow as pa

    from automq.broker.objectstore import open_object_store
    from automq.broker.objectstore.local import LocalObjectStore
    from automq.broker.storage.objects.format import TAIL_READ_BYTES
    from automq.spark.cluster import ClusterLocation, ClusterView
    from automq.spark.reader import ROW_SCHEMA, read_slice_arrow, read_stream_arrow
    from automq.spark.source import plan_slices, read_group

    topic = sh.topic_name("tails")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2)
    for r in range(3):
        sh.produce_confluent(
            spark_cluster.bootstrap, topic, [(None, b"v%d-%d" % (r, i), [], i % 2) for i in range(200)]
        )
    spark_cluster.wait_uploaded(topic, 600)
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    slices = plan_slices(ClusterView.load(location, [topic]), [topic])
    shared = {sl.object_id for sl in slices if sl.partition == 0} & {sl.object_id for sl in slices if sl.partition == 1}
    assert shared, "both partitions' records should share stream-set objects"

    async def per_slice() -> pa.Table:
        store = open_object_store(location.object_store_url)
        try:
            return pa.Table.from_batches([b for sl in slices async for b in read_slice_arrow(store, sl)], ROW_SCHEMA)
        finally:
            await store.close()

    expected = asyncio.run(per_slice())
    reads: Counter = Counter()
    real = LocalObjectStore.get_blocking

    def counting(self, key, start, end):
        reads[(key, start, end)] += 1
        return real(self, key, start, end)

    monkeypatch.setattr(LocalObjectStore, "get_blocking", counting)
    got = pa.Table.from_batches(list(read_group(location.object_store_url, tuple(slices))), ROW_SCHEMA)
    assert got.to_pylist() == expected.to_pylist() and got.num_rows == 600
    tails = {sl.object_id: (sl.key, max(0, sl.object_size - TAIL_READ_BYTES), sl.object_size) for sl in slices}
    assert {oid: reads[t] for oid, t in tails.items()} == dict.fromkeys(tails, 1)
    # and the streaming reader (one stream at a time) shares them the same way
    reads.clear()
    indexes: dict = {}

    async def by_stream() -> int:
        store = open_object_store(location.object_store_url)
        try:
            n = 0
            for p in (0, 1):
                run = [sl for sl in slices if sl.partition == p]
                n += sum([b.num_rows async for b in read_stream_arrow(store, run, indexes=indexes)])
            return n
        finally:
            await store.close()

    assert asyncio.run(by_stream()) == 600
    assert set(indexes) == set(tails) and all(reads[t] == 1 for t in tails.values())
    # the data source's own input partitions (the driver's plan, each read as Spark reads it):
    # cut by object, so over all of them each tail is fetched once, also when they are small
    from automq.spark.source import AutoMQReader, SliceGroup

    for max_bytes in (None, 1):
        reads.clear()
        options = {"topic": topic, "dataDir": str(spark_cluster.data_dir)}
        if max_bytes is not None:
            options["maxBytesPerPartition"] = str(max_bytes)
        source = AutoMQReader(options)
        parts = source.partitions()
        assert all(isinstance(p, SliceGroup) for p in parts)
        if max_bytes == 1:
            assert len(parts) == len(tails)  # one per object (not per slice), with both partitions
        rows = pa.Table.from_batches([b for part in parts for b in source.read(part)], ROW_SCHEMA)
        assert rows.sort_by([("partition", "ascending"), ("offset", "ascending")]).to_pylist() == (
            expected.sort_by([("partition", "ascending"), ("offset", "ascending")]).to_pylist()
        )
        assert {oid: reads[t] for oid, t in tails.items()} == dict.fromkeys(tails, 1)


def test_data_source_partitions_take_whole_objects_in_offset_order():
    from automq.spark.source import group_slices, with_lookahead

    # two partitions (streams 7 and 8) in the same 8 stream-set objects of 1 MiB, stream by stream
    plan = [ObjectSlice(i, 1 << 20, sid, i * 100, (i + 1) * 100) for sid in (7, 8) for i in range(8)]
    groups = group_slices(plan, 3 << 20)
    assert [sorted({sl.object_id for sl in g}) for g in groups] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    for g in groups:
        assert [sl.stream_id for sl in g] == [7] * (len(g) // 2) + [8] * (len(g) // 2)
        assert g == sorted(g, key=plan.index)
    assert dict(with_lookahead(groups, plan)[0]) == {7: tuple(plan[3:8]), 8: tuple(plan[11:16])}
    assert group_slices([], 1) == []
    # object ids out of offset order for stream 7 (a compacted object 99 holds its first
    # offsets): cut slice by slice in plan order, each stream's tasks still in offset order
    plan = [ObjectSlice(99, 4 << 20, 7, 0, 400)]
    plan += [ObjectSlice(i, 1 << 20, 7, 400 + i * 100, 500 + i * 100) for i in range(4)]
    plan += [ObjectSlice(i, 1 << 20, 8, i * 100, (i + 1) * 100) for i in range(4)]
    groups = group_slices(plan, 4 << 20)
    assert [sl for g in groups for sl in g] == plan


def test_a_write_tasks_rows_split_by_partition_without_copies_when_each_is_one_run():
    import pyarrow as pa

    from automq.spark.lakewrite import by_partition

    runs = pa.concat_tables(
        [pa.table({"p": pa.array(p, pa.int32()), "o": o}) for p, o in (([0, 0], [5, 6]), ([1], [9]))]
    )
    split = by_partition(runs, "p")
    assert [(p, t["o"].to_pylist()) for p, t in split] == [(0, [5, 6]), (1, [9])]
    assert split[0][1]["o"].chunks[0].buffers()[1].address == runs["o"].chunks[0].buffers()[1].address  # a slice
    mixed = pa.table({"p": pa.array([0, 1, 0], pa.int32()), "o": [1, 2, 3]})
    assert [(p, t["o"].to_pylist()) for p, t in by_partition(mixed, "p")] == [(0, [1, 3]), (1, [2])]
    assert by_partition(mixed.slice(0, 0), "p") == []
