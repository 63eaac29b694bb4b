"""Upsert tables (Debezium envelopes with `automq.table.topic.id.columns`) ingested by Spark
tasks, not the driver (automq.spark.lakeupsert): across partitions and tasks the latest image
of an id wins, the table's older rows are rewritten copy-on-write by tasks, and one overwrite
commit carries the offsets: a crash before it and a lost race both end exactly once. Read back
with pyiceberg, DuckDB and Polars."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pytest
from lake_tables import competitor_commits_first

from automq.spark import iceberg, lakewrite
from automq.spark import ingest as ingest_module
from automq.spark.cluster import ClusterLocation
from automq.spark.ingest import ingest

pytestmark = [pytest.mark.slow, pytest.mark.spark]

UPSERT = {
    "automq.table.topic.enable": "true",
    "automq.table.topic.convert.value.type": "json",
    "automq.table.topic.transform.value.type": "flatten_debezium",
    "automq.table.topic.id.columns": "id",
}


class Crash(BaseException):
    """Stands for the process dying: nothing on the way catches it."""


def _env(op: str, before: dict | None, after: dict | None) -> bytes:
    return json.dumps({"payload": {"op": op, "before": before, "after": after, "ts_ms": 1}}).encode()


def _rows(table) -> list[tuple]:
    return sorted((r["id"], r["name"]) for r in table.scan().to_arrow().to_pylist())


def _files(table) -> set[str]:
    return {t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()}


def test_upserts_run_in_tasks_and_commit_once(spark, spark_cluster, sh, tmp_path, monkeypatch):
    catalog = iceberg.open_catalog(f"sqlite:///{tmp_path}/lake/catalog.db")
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    topic = sh.topic_name("upsert")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2, configs=UPSERT)
    # the driver never holds rows: its read-to-Arrow path and converting non-empty rows fail
    monkeypatch.setattr(ingest_module, "_read", lambda *a, **k: pytest.fail("the driver read the rows"))
    real_convert = ingest_module.convert

    def driver_convert(rows, settings):
        assert rows.num_rows == 0, "the driver converted rows"
        return real_convert(rows, settings)

    monkeypatch.setattr(ingest_module, "convert", driver_convert)
    # one map task per object slice: the ids' images are spread over many tasks
    monkeypatch.setattr(lakewrite, "task_groups", lambda slices, parallelism, max_bytes: [[sl] for sl in slices])

    # an id lives in one partition (Debezium keys by id), written in two uploads each
    first = [(None, _env("c", None, {"id": i, "name": f"a{i}"}), [], i % 2) for i in range(40)]
    sh.produce_confluent(spark_cluster.bootstrap, topic, first[:20])
    spark_cluster.wait_uploaded(topic, 20)
    sh.produce_confluent(spark_cluster.bootstrap, topic, first[20:])
    spark_cluster.wait_uploaded(topic, 40)
    sc = spark.sparkContext
    sc.setJobGroup("upsert-first", "first upsert run")
    [r1] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r1.status == "committed" and r1.records == 40, r1
    tracker = sc.statusTracker()
    stages = [s for j in tracker.getJobIdsForGroup("upsert-first") for s in tracker.getJobInfo(j).stageIds]
    tasks = sum(tracker.getStageInfo(s).numTasks for s in stages if tracker.getStageInfo(s) is not None)
    assert len(stages) >= 3 and tasks >= 4, (stages, tasks)  # map, shuffle and reduce stages, several tasks
    assert r1.task_cpu_seconds > 0
    table = catalog.load_table(r1.table)
    assert _rows(table) == [(i, f"a{i}") for i in range(40)]

    # updates of an id in two uploads (the later wins), deletes, and new ids, in both partitions
    second = [(None, _env("u", {"id": i, "name": f"a{i}"}, {"id": i, "name": f"b{i}"}), [], i % 2) for i in range(10)]
    second += [(None, _env("d", {"id": i, "name": f"a{i}"}, None), [], i % 2) for i in (20, 21)]
    third = [(None, _env("u", {"id": i, "name": f"b{i}"}, {"id": i, "name": f"c{i}"}), [], i % 2) for i in (3, 4)]
    third += [(None, _env("c", None, {"id": i, "name": f"a{i}"}), [], i % 2) for i in (50, 51)]
    third.append((None, _env("c", None, {"id": 21, "name": "again"}), [], 1))  # deleted, then created again
    sh.produce_confluent(spark_cluster.bootstrap, topic, second)
    spark_cluster.wait_uploaded(topic, 40 + len(second))
    sh.produce_confluent(spark_cluster.bootstrap, topic, third)
    total = 40 + len(second) + len(third)
    spark_cluster.wait_uploaded(topic, total)
    expected = {i: f"a{i}" for i in range(40)}
    expected.update({i: f"b{i}" for i in range(10)})
    expected.update({3: "c3", 4: "c4", 50: "a50", 51: "a51", 21: "again"})
    del expected[20]
    expected_rows = sorted(expected.items())

    before = _files(table)
    seen = []

    def crash(name, t):
        seen.append(name)
        raise Crash()

    with pytest.raises(Crash):
        ingest(spark, location, catalog, [topic], enabled_topics=False, before_commit=crash)
    table = catalog.load_table(r1.table)
    assert seen and _rows(table) == [(i, f"a{i}") for i in range(40)]  # nothing of the crashed run
    assert iceberg.committed_offsets(table) == r1.offsets

    # the rerun races a competitor: the competitor's commit wins, the rerun re-plans to nothing
    competitor, _won = competitor_commits_first(spark, location, catalog, topic)
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False, before_commit=competitor)
    assert (r2.status, r2.attempts) == ("up-to-date", 2), r2
    table = catalog.load_table(r1.table)
    assert _rows(table) == expected_rows
    assert sum(iceberg.committed_offsets(table).values()) == total
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "overwrite"
    # copy-on-write: no delete files, the old files holding replaced rows are gone from the snapshot
    assert not any(t.delete_files for t in table.scan().plan_files())
    assert before - _files(table)
    # the loser deleted its own files: the warehouse holds the table's files, plus only the
    # crashed run's orphans (which remove_orphans takes)
    warehouse = {str(p) for p in Path(tmp_path, "lake").glob("**/*.parquet")}
    reachable = {p.removeprefix("file://") for p in iceberg_files(table) if p.endswith(".parquet")}
    orphans = warehouse - reachable
    [r3] = ingest(spark, location, catalog, [topic], enabled_topics=False, remove_orphans_ms=0)
    assert orphans and r3.status == "up-to-date" and r3.removed_files >= len(orphans)
    assert {str(p) for p in Path(tmp_path, "lake").glob("**/*.parquet")} == reachable
    duck = duckdb.sql(f"select id, name from read_parquet({sorted(_files(table))!r}) order by id").fetchall()
    assert duck == expected_rows
    assert pl.scan_iceberg(table).select("id", "name").sort("id").collect().rows() == expected_rows


def iceberg_files(table) -> set[str]:
    from automq.spark import lakefiles

    return set(lakefiles.reachable_files(table))


def _source_rows(values: list[bytes], offsets: list[int]):
    import pyarrow as pa

    from automq.spark.reader import ROW_SCHEMA

    n = len(values)
    return pa.table(
        {
            "topic": ["t"] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "timestamp_type": pa.array([0] * n, pa.int32()),
            "key": pa.array([None] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": pa.array([[]] * n, ROW_SCHEMA.field("headers").type),
        },
        schema=ROW_SCHEMA,
    )


def test_a_reduce_task_keeps_each_ids_latest_image_below_the_last_stable_offset(tmp_path):
    """No Spark: one bucket's rows from two map tasks and one old file's ids. An image past the
    partition's last stable offset is the next run's, so the earlier one wins this run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from automq.spark import lakeupsert
    from automq.spark.convert import TableSettings, convert

    settings = TableSettings(convert="json", transform="flatten_debezium")
    a = convert(
        _source_rows([_env("c", None, {"id": 1, "name": "a"}), _env("c", None, {"id": 2, "name": "x"})], [0, 1]),
        settings,
    ).rows
    b = convert(
        _source_rows([_env("d", {"id": 2, "name": "x"}, None), _env("u", None, {"id": 1.0, "name": "late"})], [2, 5]),
        settings,
    ).rows
    # the same id typed apart by two tasks' inference (1 and 1.0) lands in one bucket
    assert lakeupsert.buckets(a, ("id",), 7)[0] == lakeupsert.buckets(b, ("id",), 7)[1]
    catalog = iceberg.open_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "warehouse"))
    table = iceberg.create_table(
        catalog, "kafka.t", pa.unify_schemas([a.schema, b.schema], promote_options="permissive"), "t"
    )
    old = pa.table(
        {
            "id": pa.array([1.0, 99.0]),
            "__automq_pos": pa.array([0, 1], pa.int64()),
            "__automq_file": pa.array([7, 7], pa.int32()),
        }
    )
    params = lakeupsert.ReduceParams(table.metadata, dict(table.io.properties), ("id",), {0: 3})
    out = lakeupsert.reduce_task(params, (0, ([lakewrite.to_ipc(a), lakewrite.to_ipc(b)], [lakewrite.to_ipc(old)])))
    files = [o[1] for o in out if o[0] == "file"]
    assert [o[1:] for o in out if o[0] == "drop"] == [(7, [0])]  # id 1's old row goes, 99 stays
    rows = pa.concat_tables(pq.read_table(f.data_file.file_path.removeprefix("file://")) for f in files)
    assert [(r["id"], r["name"]) for r in rows.to_pylist()] == [(1.0, "a")]  # id 2 deleted, "late" waits


def test_records_without_an_id_follow_errors_tolerance_and_tombstones_are_skipped():
    """No Spark: a Debezium image lacking an id column or with a null id names no row (all of
    them would collapse into one "null" id): a bad record, failing the run naming where it
    is, or a dead letter with errors.tolerance=all. Null values (Debezium's tombstones after
    a delete) are no rows and no dead letters."""
    from automq.spark.convert import ConversionError, TableSettings, convert

    values = [
        _env("c", None, {"id": 1, "region": "eu", "name": "a"}),
        _env("c", None, {"id": 2, "name": "no region"}),
        _env("c", None, {"id": None, "region": "eu", "name": "null id"}),
        None,  # tombstone
        _env("u", None, {"id": 1, "region": "eu", "name": "b"}),
    ]
    rows = _source_rows(values, [10, 11, 12, 13, 14])
    strict = TableSettings(convert="json", transform="flatten_debezium", id_columns=("id", "region"))
    with pytest.raises(ConversionError, match=r"2 record\(s\).*topic t partition 0 offset 11.*id.columns") as err:
        convert(rows, strict, merge_ids=False)
    assert "errors.tolerance=all" in str(err.value)
    from dataclasses import replace

    tolerant = replace(strict, errors_tolerance="all")
    for merge, kept in ((False, [(1, "a"), (1, "b")]), (True, [(1, "b")])):
        out = convert(rows, tolerant, merge_ids=merge)
        assert [(r["id"], r["name"]) for r in out.rows.to_pylist()] == kept
        assert [(d["offset"], d["value"]) for d in out.dead.to_pylist()] == [(11, values[1]), (12, values[2])]
        assert all("id.columns" in d["error"] for d in out.dead.to_pylist())
    # a column no record has: every record is a dead letter
    out = convert(rows, replace(tolerant, id_columns=("id", "tenant")))
    assert out.rows.num_rows == 0 and out.dead.num_rows == 4


def test_several_id_columns_replace_the_right_rows_and_prune_by_every_column(
    spark, spark_cluster, sh, tmp_path, caplog
):
    """Ids of two columns (id, region): the same id in two regions are two rows. A run that
    touches region "eu" only reads the old files whose bounds overlap the run's range of BOTH
    columns (the "us" files share the id range, not the region). Records lacking an id fail
    the run under errors.tolerance=none, go to <table>_dlq under all."""
    import logging

    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    from automq.spark import lakeupsert

    catalog = iceberg.open_catalog(f"sqlite:///{tmp_path}/lake/catalog.db")
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    topic = sh.topic_name("upsert2")
    sh.create_topic(spark_cluster.bootstrap, topic, configs={**UPSERT, "automq.table.topic.id.columns": "id,region"})
    produced = 0

    def produce_and_ingest(records: list[bytes | None]):
        nonlocal produced
        sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, v, [], 0) for v in records])
        produced += len(records)
        spark_cluster.wait_uploaded(topic, produced)
        [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
        return r

    def image(i: int, region: str | None, name: str) -> dict:
        return {"id": i, "name": name} | ({"region": region} if region else {})

    r = produce_and_ingest([_env("c", None, image(i, "eu", f"eu{i}")) for i in range(10)])
    assert r.status == "committed", r
    eu_files = _files(catalog.load_table(r.table))
    r = produce_and_ingest([_env("c", None, image(i, "us", f"us{i}")) for i in range(10)])
    assert r.status == "committed", r
    table = catalog.load_table(r.table)
    us_files = _files(table) - eu_files
    assert eu_files and us_files
    # by every id column: the "us" files hold ids 0..9 too, but not region "eu"
    candidates = lakeupsert.candidate_files(table, [((3, 4), ("eu", "eu"))], ("id", "region"))
    assert {f.file_path.removeprefix("file://") for f in candidates} == eu_files

    third = [
        _env("u", image(3, "eu", "eu3"), image(3, "eu", "eu3b")),
        _env("d", image(4, "eu", "eu4"), None),
        None,  # the tombstone after the delete
        _env("c", None, image(5, None, "no region")),
    ]
    r = produce_and_ingest(third)
    assert r.status == "failed" and f"topic {topic} partition 0 offset {produced - 1}" in r.message, r
    assert "id.columns" in r.message and "errors.tolerance=all" in r.message
    assert _files(catalog.load_table(r.table)) == eu_files | us_files  # nothing committed

    entry = ConfigEntry("automq.table.topic.errors.tolerance", "all", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": spark_cluster.bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(30)
    caplog.set_level(logging.INFO, logger="automq.spark.lakeupsert")
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r.status, r.records, r.dead_letters) == ("committed", 1, 1), r
    [line] = [m for m in caplog.messages if f"{topic}: upsert:" in m]
    assert f"({len(eu_files)} old files read)" in line, line  # not the "us" files
    table = catalog.load_table(r.table)
    expected = sorted(
        [(i, "us", f"us{i}") for i in range(10)] + [(i, "eu", f"eu{i}") for i in range(10) if i not in (3, 4)]
    )
    expected = sorted([*expected, (3, "eu", "eu3b")])
    assert sorted((x["id"], x["region"], x["name"]) for x in table.scan().to_arrow().to_pylist()) == expected
    assert us_files <= _files(table) and eu_files - _files(table)  # only "eu" files were rewritten
    assert sorted(pl.scan_iceberg(table).select("id", "region", "name").collect().rows()) == expected
    paths = sorted(_files(table))
    assert sorted(duckdb.sql(f"select id, region, name from read_parquet({paths!r})").fetchall()) == expected
    [dead] = catalog.load_table(r.table + "_dlq").scan().to_arrow().to_pylist()
    assert dead["offset"] == produced - 1 and dead["value"] == third[-1] and "id.columns" in dead["error"]
    assert iceberg.committed_offsets(table) == {0: produced}
