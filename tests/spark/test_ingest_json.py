"""JSON tables written by the executors: each task infers the columns of its own records,
the tasks that met columns the table lacks run again after the driver widened the table
once; dead letters come from the tasks; a run that dies before its commit leaves the rows and
offsets as they were and the rerun writes every record once. (The topics here are not
`automq.table.topic.enable`d: other modules' runs over all enabled topics must not meet them.)"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import polars as pl
import pytest

from automq.spark import iceberg, lakeschema, lakewrite
from automq.spark.cluster import ClusterLocation
from automq.spark.ingest import ingest

pytestmark = [pytest.mark.slow, pytest.mark.spark]


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing on the way catches it."""


def _rec(partition: int, doc: dict | bytes) -> tuple:
    return (None, doc if isinstance(doc, bytes) else json.dumps(doc).encode(), [], partition)


def _parquet(table) -> tuple[set[str], set[str]]:
    """(data files on disk, data files the table references)."""
    root = Path(table.location().removeprefix("file://")) / "data"
    on_disk = {str(p) for p in root.rglob("*.parquet")}
    referenced = {t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()}
    return on_disk, referenced


def test_json_tasks_infer_their_columns_widen_once_and_survive_a_crash(
    spark, spark_cluster, sh, tmp_path, monkeypatch, caplog
):
    # every object slice its own task, so the two partitions' records meet different columns
    monkeypatch.setattr(lakewrite, "task_groups", lambda slices, parallelism, max_bytes: [[sl] for sl in slices])
    caplog.set_level(logging.INFO, logger="automq.spark")
    catalog = iceberg.open_catalog(f"sqlite:///{tmp_path}/lake/catalog.db")
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    topic = sh.topic_name("jsonx")
    sh.create_topic(
        spark_cluster.bootstrap,
        topic,
        partitions=2,
        configs={
            "automq.table.topic.convert.value.type": "json",
            "automq.table.topic.errors.tolerance": "all",
            "automq.table.topic.partition.by": "bucket(id, 2)",  # a JSON field: the table is made after inference
        },
    )
    # run 1 creates the table: partition 0 meets `a`, partition 1 `n` as an int and as a double
    # and `code` as a number in one partition and as text in the other (text, as one decode of both gives)
    first = [_rec(0, {"id": i, "a": f"a{i}", "code": i}) for i in range(6)] + [_rec(0, b"not json")]
    first += [_rec(1, {"id": 100 + i, "n": i, "code": "c"}) for i in range(3)] + [_rec(1, {"id": 103, "n": 0.5})]
    ends = sh.produce_confluent(spark_cluster.bootstrap, topic, first)
    spark_cluster.wait_uploaded(topic, ends)
    [r1] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r1.status, r1.records, r1.dead_letters, r1.offsets) == ("committed", 10, 1, ends), r1
    table = catalog.load_table(r1.table)
    assert [str(f.transform) for f in table.spec().fields] == ["bucket[2]"]
    assert str(table.schema().find_field("n").field_type) == "double"
    assert {"id", "a", "n", "_kafka_offset"} <= set(table.schema().column_names)

    # run 2: partition 0 has nothing new (its tasks write at once), partition 1 meets `b` and
    # ints for the double `n`, and a record that is not an object
    second = [_rec(0, {"id": 6 + i, "a": "later"}) for i in range(4)]
    second += [_rec(1, {"id": 104 + i, "n": 7, "b": True}) for i in range(3)] + [_rec(1, b"[1]")]
    ends = sh.produce_confluent(spark_cluster.bootstrap, topic, second)
    spark_cluster.wait_uploaded(topic, ends)
    caplog.clear()
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r2.status, r2.records, r2.dead_letters, r2.offsets) == ("committed", 7, 1, ends), r2
    assert any("table widened for" in m for m in caplog.messages)
    table = catalog.load_table(r1.table)
    # the tasks that wrote at once were not run again and the widened ones wrote nothing the
    # first time: every file on disk is one the table references
    on_disk, referenced = _parquet(table)
    assert on_disk == referenced
    df = pl.scan_iceberg(table).sort("_kafka_partition", "_kafka_offset").collect()
    assert df["id"].to_list() == list(range(10)) + list(range(100, 107))
    assert df["a"].to_list() == [f"a{i}" for i in range(6)] + ["later"] * 4 + [None] * 7
    assert df["n"].to_list() == [None] * 10 + [0.0, 1.0, 2.0, 0.5, 7.0, 7.0, 7.0]
    assert df["b"].to_list() == [None] * 14 + [True] * 3
    assert df["code"].to_list() == [str(i) for i in range(6)] + [None] * 4 + ["c"] * 3 + [None] * 4

    # run 3 meets `c` and a bad record, and dies before its commit: rows and offsets stay,
    # the rerun writes every record once and the dead letter once
    third = [_rec(0, {"id": 10, "c": "x"}), _rec(0, b"{"), _rec(1, {"id": 107, "b": False})]
    ends = sh.produce_confluent(spark_cluster.bootstrap, topic, third)
    spark_cluster.wait_uploaded(topic, ends)
    snapshot = table.current_snapshot().snapshot_id

    def die(name, table):
        raise Crash()

    with pytest.raises(Crash):
        ingest(spark, location, catalog, [topic], enabled_topics=False, before_commit=die)
    table = catalog.load_table(r1.table)
    assert table.current_snapshot().snapshot_id == snapshot and iceberg.committed_offsets(table) == r2.offsets
    assert table.scan().to_arrow().num_rows == 17
    on_disk, referenced = _parquet(table)
    assert on_disk - referenced, "the crash should come after the data files were written"

    [r3] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r3.status, r3.records, r3.offsets) == ("committed", 2, ends), r3
    assert r3.dead_letters == 0  # the dead letter went to the DLQ table before the crash, with its offsets
    table = catalog.load_table(r1.table)
    df = pl.scan_iceberg(table).sort("_kafka_partition", "_kafka_offset").collect()
    assert df.select("_kafka_partition", "_kafka_offset").unique().height == df.height == 19
    assert df["id"].to_list() == list(range(11)) + list(range(100, 108))
    assert df["c"].to_list() == [None] * 10 + ["x"] + [None] * 8
    dlq = (
        catalog.load_table(r1.table + "_dlq")
        .scan()
        .to_arrow()
        .sort_by([("partition", "ascending"), ("offset", "ascending")])
    )
    assert [(d["partition"], d["offset"], d["value"]) for d in dlq.to_pylist()] == [
        (0, 6, b"not json"),
        (0, 12, b"{"),
        (1, 7, b"[1]"),
    ]
    assert all(d["error"] for d in dlq.to_pylist())


def test_a_run_that_loses_the_race_while_widening_deletes_its_files_and_replans(
    spark, spark_cluster, sh, tmp_path, monkeypatch
):
    monkeypatch.setattr(lakewrite, "task_groups", lambda slices, parallelism, max_bytes: [[sl] for sl in slices])
    catalog = iceberg.open_catalog(f"sqlite:///{tmp_path}/lake/catalog.db")
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    topic = sh.topic_name("jsonrace")
    configs = {"automq.table.topic.convert.value.type": "json"}
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2, configs=configs)
    ends = sh.produce_confluent(spark_cluster.bootstrap, topic, [_rec(p, {"id": p}) for p in (0, 1)])
    spark_cluster.wait_uploaded(topic, ends)
    [r1] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r1.status == "committed"
    # partition 0's task writes at once, partition 1's meets `z`; before this run widens the
    # table, another run ingests (and widens) everything
    ends = sh.produce_confluent(spark_cluster.bootstrap, topic, [_rec(0, {"id": 2}), _rec(1, {"id": 3, "z": 1})])
    spark_cluster.wait_uploaded(topic, ends)
    evolve, other, raced = lakeschema.evolve, [], []

    def another_run_first(table, schemas):
        if not raced:
            raced.append(True)
            other.append(ingest(spark, location, catalog, [topic], enabled_topics=False))
        evolve(table, schemas)

    monkeypatch.setattr(lakeschema, "evolve", another_run_first)
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    [[won]] = other
    assert (won.status, won.records, won.offsets) == ("committed", 2, ends)
    assert (r2.status, r2.attempts, r2.offsets) == ("up-to-date", 2, ends)
    table = catalog.load_table(r1.table)
    on_disk, referenced = _parquet(table)
    assert on_disk == referenced  # the loser deleted the file its task wrote
    rows = sorted(
        (r["_kafka_partition"], r["_kafka_offset"], r["id"], r["z"]) for r in table.scan().to_arrow().to_pylist()
    )
    assert rows == [(0, 0, 0, None), (0, 1, 2, None), (1, 0, 1, None), (1, 1, 3, 1)]
