"""Lake ingestion against a real cluster: Iceberg tables (pyiceberg SQL catalog on sqlite)
read back with pyiceberg, DuckDB and Polars equal what a Kafka consumer reads; reruns add
nothing; a run that dies between writing files and committing, then reruns, gives every
record exactly once; a run that loses a concurrent commit re-plans."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import duckdb
import polars as pl
import pytest
from lake_tables import Crash, assert_read_back, competitor_commits_first
from lake_tables import data_files as _data_files
from lake_tables import produce_mix as _produce_mix
from lake_tables import table_rows as _table_rows

from automq.spark import iceberg, lakefiles
from automq.spark.ingest import ingest

pytestmark = [pytest.mark.slow, pytest.mark.spark]

TABLE_ON = {"automq.table.topic.enable": "true"}


def test_raw_tables_exactly_once_across_reruns_and_a_crash(spark, spark_cluster, sh, catalog, location):
    topic = sh.topic_name("lake")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2, configs=TABLE_ON)
    total = _produce_mix(sh, spark_cluster.bootstrap, topic, 60, "a")
    spark_cluster.wait_uploaded(topic, total)

    results = {r.topic: r for r in ingest(spark, location, catalog)}
    assert set(results) == {topic}, "earlier tests' table topics must be gone (conftest deletes them)"
    assert results[topic].status == "committed" and results[topic].records == total
    table = catalog.load_table(results[topic].table)
    expected = sh.consume_all(spark_cluster.bootstrap, topic, total)
    assert len(expected) == total
    assert_read_back(table, expected)  # pyiceberg, DuckDB (the Parquet files) and Polars (scan_iceberg)

    # a rerun adds nothing
    again = {r.topic: r for r in ingest(spark, location, catalog, [topic], enabled_topics=False)}
    assert again[topic].status == "up-to-date"
    assert _table_rows(catalog.load_table(results[topic].table)) == expected

    # more data; the run dies after writing its files, before the commit
    total += _produce_mix(sh, spark_cluster.bootstrap, topic, 30, "b")
    spark_cluster.wait_uploaded(topic, total)
    snapshot_before = catalog.load_table(results[topic].table).current_snapshot().snapshot_id

    def die(name, table):
        raise Crash()

    with pytest.raises(Crash):
        ingest(spark, location, catalog, [topic], enabled_topics=False, before_commit=die)
    table = catalog.load_table(results[topic].table)
    assert table.current_snapshot().snapshot_id == snapshot_before
    assert _table_rows(table) == expected
    on_disk = {str(p) for p in catalog.warehouse_dir.glob("**/*.parquet")}
    orphans = on_disk - set(_data_files(table))
    assert orphans, "the crash should come after the data files were written"

    rerun = {r.topic: r for r in ingest(spark, location, catalog, [topic], enabled_topics=False)}
    assert rerun[topic].status == "committed" and rerun[topic].records == total - len(expected)
    expected = sh.consume_all(spark_cluster.bootstrap, topic, total)
    rows = _table_rows(catalog.load_table(results[topic].table))
    assert rows == expected
    assert len({(p, o) for p, o, *_ in rows}) == total
    assert iceberg.committed_offsets(catalog.load_table(results[topic].table)) == {
        p: max(o for q, o, *_ in expected if q == p) + 1 for p in (0, 1)
    }

    # the killed run's files (written by the executors, never committed) are orphans the
    # lake cleanup deletes; the table keeps every row
    table = catalog.load_table(results[topic].table)
    removed = lakefiles.remove_orphans(table, int(time.time() * 1000) + 60_000)
    assert removed.files >= len(orphans) and not any(Path(o).exists() for o in orphans)
    assert _table_rows(catalog.load_table(results[topic].table)) == expected


def test_a_run_that_loses_a_concurrent_commit_replans(spark, spark_cluster, sh, catalog, location):
    topic = sh.topic_name("race")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=1)
    ends = sh.produce_confluent(spark_cluster.bootstrap, topic, [(b"k", str(i).encode(), [], 0) for i in range(200)])
    spark_cluster.wait_uploaded(topic, ends)
    competitor, won = competitor_commits_first(spark, location, catalog, topic)
    [result] = ingest(spark, location, catalog, [topic], enabled_topics=False, before_commit=competitor)
    assert won[0].records == 200  # the competitor won with everything
    assert result.status == "up-to-date" and result.attempts == 2  # lost, re-planned, nothing left
    table = catalog.load_table(result.table)
    offsets = [r["offset"] for r in table.scan().to_arrow().to_pylist()]
    assert sorted(offsets) == list(range(200))
    assert len(table.snapshots()) == 1
    # the loser deleted the data files its executors wrote: nothing unreferenced is left
    assert {str(p) for p in catalog.warehouse_dir.glob("**/*.parquet")} == set(_data_files(table))


def test_ingest_while_producing_then_catch_up(spark, spark_cluster, sh, catalog, location):
    topic = sh.topic_name("live")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2, configs=TABLE_ON)
    stop = threading.Event()
    produced = [0]

    def producer():
        i = 0
        while not stop.is_set():
            sh.produce_confluent(
                spark_cluster.bootstrap, topic, [(str(j).encode(), str(i + j).encode(), [], j % 2) for j in range(50)]
            )
            i += 50
            produced[0] = i

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    try:
        spark_cluster.wait_uploaded(topic, 200)
        first = ingest(spark, location, catalog, [topic], enabled_topics=False)[0]
        assert first.status == "committed"
    finally:
        stop.set()
        thread.join(60)
    spark_cluster.wait_uploaded(topic, produced[0])
    ingest(spark, location, catalog, [topic], enabled_topics=False)
    table = catalog.load_table(first.table)
    rows = table.scan().to_arrow()
    assert rows.num_rows == produced[0]
    pairs = {(r["partition"], r["offset"]) for r in rows.select(["partition", "offset"]).to_pylist()}
    assert len(pairs) == produced[0]
    expected = sh.consume_all(spark_cluster.bootstrap, topic, produced[0])
    assert sorted(pairs) == [(p, o) for p, o, *_ in expected]


def test_json_values_evolve_the_schema_and_bad_records_go_to_the_dead_letter_table(
    spark, spark_cluster, sh, catalog, location
):
    topic = sh.topic_name("json")
    sh.create_topic(
        spark_cluster.bootstrap,
        topic,
        configs={
            **TABLE_ON,
            "automq.table.topic.convert.value.type": "json",
            "automq.table.topic.transform.value.type": "flatten",
            "automq.table.topic.errors.tolerance": "all",
            "automq.table.topic.namespace": "lake",
            "automq.table.topic.partition.by": "bucket(id, 4), day(_kafka_timestamp)",
        },
    )
    first = [(None, json.dumps({"id": i, "name": f"n{i}", "geo": {"lat": i / 2}}).encode(), [], 0) for i in range(20)]
    first.insert(5, (None, b"{not json", [], 0))
    first.insert(9, (None, b"[1, 2]", [], 0))
    sh.produce_confluent(spark_cluster.bootstrap, topic, first)
    spark_cluster.wait_uploaded(topic, len(first))
    [r1] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r1.status, r1.records, r1.dead_letters) == ("committed", 20, 2)
    assert r1.table.startswith("lake.")

    later = [(None, json.dumps({"id": 100 + i, "name": "x", "extra": True}).encode(), [], 0) for i in range(5)]
    sh.produce_confluent(spark_cluster.bootstrap, topic, later)
    spark_cluster.wait_uploaded(topic, len(first) + len(later))
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r2.status, r2.records, r2.dead_letters) == ("committed", 5, 0)

    table = catalog.load_table(r1.table)
    assert [str(f.transform) for f in table.spec().fields] == ["bucket[4]", "day"]
    names = {f.name for f in table.schema().fields}
    assert {"id", "name", "geo_lat", "extra", "_kafka_offset", "_kafka_partition"} <= names
    df = pl.scan_iceberg(table).sort("_kafka_offset").collect()
    assert df["id"].to_list() == list(range(20)) + [100 + i for i in range(5)]
    assert df["extra"].to_list() == [None] * 20 + [True] * 5
    assert df["geo_lat"].to_list()[:3] == [0.0, 0.5, 1.0]
    dlq = catalog.load_table(r1.table + "_dlq").scan().to_arrow().sort_by("offset").to_pylist()
    assert [(d["offset"], d["value"]) for d in dlq] == [(5, b"{not json"), (9, b"[1, 2]")]
    assert all(d["error"] for d in dlq)


def test_bad_records_fail_the_run_when_not_tolerated(spark, spark_cluster, sh, catalog, location):
    topic = sh.topic_name("strict")
    sh.create_topic(
        spark_cluster.bootstrap, topic, configs={**TABLE_ON, "automq.table.topic.convert.value.type": "json"}
    )
    sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, b'{"a": 1}', [], 0), (None, b"oops", [], 0)])
    spark_cluster.wait_uploaded(topic, 2)
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r.status == "failed"
    assert "offset 1" in r.message and "errors.tolerance=all" in r.message
    assert iceberg.load_table(catalog, r.table) is None  # nothing half-made


def test_string_values_partitioned_with_dead_letters_and_strict_failure(spark, spark_cluster, sh, catalog, location):
    """Executor-written tables: string conversion, partition.by, invalid UTF-8 to the DLQ;
    with errors.tolerance=none the run fails naming the record and leaves no table."""
    topic = sh.topic_name("text")
    configs = {
        **TABLE_ON,
        "automq.table.topic.convert.value.type": "string",
        "automq.table.topic.errors.tolerance": "all",
        "automq.table.topic.partition.by": "partition, day(timestamp)",
    }
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2, configs=configs)
    recs = [(None, f"v{i}".encode(), [], i % 2) for i in range(20)]
    recs.insert(7, (None, b"\xff\xfe not utf-8", [], 1))
    ends = sh.produce_confluent(spark_cluster.bootstrap, topic, recs)
    spark_cluster.wait_uploaded(topic, ends)
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r.status, r.records, r.dead_letters) == ("committed", 20, 1), r
    assert r.offsets == ends
    table = catalog.load_table(r.table)
    assert [str(f.transform) for f in table.spec().fields] == ["identity", "day"]
    assert str(table.schema().find_field("value").field_type) == "string"
    got = pl.scan_iceberg(table).select("partition", "value").sort("partition", "value").collect().rows()
    assert got == sorted((i % 2, f"v{i}") for i in range(20))
    files = _data_files(table)
    assert len(files) >= 2  # a file per table partition at least
    assert duckdb.sql(f"select count(*) from read_parquet({files!r})").fetchall() == [(20,)]
    [dead] = catalog.load_table(r.table + "_dlq").scan().to_arrow().to_pylist()
    assert (dead["partition"], dead["value"]) == (1, b"\xff\xfe not utf-8") and "UTF-8" in dead["error"]

    strict = sh.topic_name("text-strict")
    sh.create_topic(
        spark_cluster.bootstrap, strict, configs={**TABLE_ON, "automq.table.topic.convert.value.type": "string"}
    )
    ends = sh.produce_confluent(spark_cluster.bootstrap, strict, [(None, b"ok", [], 0), (None, b"\xc3(", [], 0)])
    spark_cluster.wait_uploaded(strict, ends)
    [r] = ingest(spark, location, catalog, [strict], enabled_topics=False)
    assert r.status == "failed" and "offset 1" in r.message and "errors.tolerance=all" in r.message
    assert iceberg.load_table(catalog, r.table) is None  # nothing half-made
    assert not list(catalog.warehouse_dir.glob(f"**/{r.table.split('.')[-1]}/data/*.parquet"))


def test_table_configs_are_validated_by_the_broker(spark_cluster):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

    admin = AdminClient({"bootstrap.servers": spark_cluster.bootstrap})
    bad = NewTopic("bad-table-cfg", 1, 1, config={"automq.table.topic.partition.by": "week(ts)"})
    with pytest.raises(KafkaException, match="automq.table.topic.partition.by"):
        admin.create_topics([bad])["bad-table-cfg"].result(30)
    # and kafka-configs' path: IncrementalAlterConfigs on an existing topic
    good = "good-table-cfg"
    admin.create_topics([NewTopic(good, 1, 1)])[good].result(30)
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        good,
        incremental_configs=[
            ConfigEntry("automq.table.topic.convert.value.type", "avro", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(KafkaException, match="convert.value.type"):
        admin.incremental_alter_configs([resource])[resource].result(30)
    ok = ConfigResource(
        ConfigResource.Type.TOPIC,
        good,
        incremental_configs=[
            ConfigEntry("automq.table.topic.enable", "true", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([ok])[ok].result(30)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, good)])
    [entries] = [f.result(30) for f in described.values()]
    assert entries["automq.table.topic.enable"].value == "true"


def test_debezium_envelopes_upsert_on_id_columns(spark, spark_cluster, sh, catalog, location):
    topic = sh.topic_name("cdc")
    sh.create_topic(
        spark_cluster.bootstrap,
        topic,
        configs={
            **TABLE_ON,
            "automq.table.topic.convert.value.type": "json",
            "automq.table.topic.transform.value.type": "flatten_debezium",
            "automq.table.topic.id.columns": "id",
        },
    )

    def env(op, before, after):
        return (None, json.dumps({"payload": {"op": op, "before": before, "after": after, "ts_ms": 1}}).encode(), [], 0)

    first = [env("c", None, {"id": i, "name": f"v{i}", "addr": {"city": "x"}}) for i in range(5)]
    first.append(env("u", {"id": 1, "name": "v1"}, {"id": 1, "name": "v1b", "addr": {"city": "y"}}))
    sh.produce_confluent(spark_cluster.bootstrap, topic, first)
    spark_cluster.wait_uploaded(topic, len(first))
    [r1] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r1.status == "committed", r1.message
    second = [
        env("d", {"id": 2, "name": "v2"}, None),
        env("u", {"id": 3, "name": "v3"}, {"id": 3, "name": "v3b", "addr": {"city": "z"}}),
        env("c", None, {"id": 9, "name": "v9", "addr": {"city": "q"}}),
    ]
    sh.produce_confluent(spark_cluster.bootstrap, topic, second)
    spark_cluster.wait_uploaded(topic, len(first) + len(second))
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r2.status == "committed", r2.message
    table = catalog.load_table(r1.table)
    rows = sorted((r["id"], r["name"], r["addr_city"]) for r in table.scan().to_arrow().to_pylist())
    expected = [(0, "v0", "x"), (1, "v1b", "y"), (3, "v3b", "z"), (4, "v4", "x"), (9, "v9", "q")]
    assert rows == expected
    assert iceberg.committed_offsets(table) == {0: len(first) + len(second)}

    # maintenance of the upsert table: pyiceberg deletes copy-on-write (data files rewritten, no
    # delete files), so small-file compaction applies; then every snapshot but the current one
    # expires and the files none of them reaches go, with an orphan a killed run left
    assert not any(t.delete_files for t in table.scan().plan_files())
    replaced = set(_data_files(table))
    orphan = Path(table.location().removeprefix("file://")) / "data" / "orphan-from-a-killed-run.parquet"
    orphan.write_bytes(b"PAR1 not referenced by anything")
    [r3] = ingest(
        spark,
        location,
        catalog,
        [topic],
        enabled_topics=False,
        compact_files_below=64 << 20,
        expire_snapshots_ms=0,
        remove_orphans_ms=0,
    )
    assert (r3.status, r3.compacted_files) == ("up-to-date", len(replaced)), r3
    table = catalog.load_table(r1.table)
    assert len(table.snapshots()) == 1 and len(_data_files(table)) == 1
    assert iceberg.committed_offsets(table) == {0: len(first) + len(second)}
    assert not orphan.exists() and r3.removed_files > 1
    left = _files_under(table)
    assert not replaced & left  # the small files the compaction replaced are deleted
    # what is left on disk is exactly what the table references (plus its metadata JSON files)
    referenced = {p.removeprefix("file://") for p in lakefiles.reachable_files(table)}
    assert {f for f in left if not f.endswith(".metadata.json")} == referenced
    assert sorted((r["id"], r["name"], r["addr_city"]) for r in table.scan().to_arrow().to_pylist()) == expected
    files = _data_files(table)
    duck = duckdb.sql(f"select id, name, addr_city from read_parquet({files!r}) order by id").fetchall()
    assert duck == expected
    polars = pl.scan_iceberg(table).select("id", "name", "addr_city").sort("id").collect().rows()
    assert polars == expected


def _files_under(table) -> set[str]:
    root = Path(table.location().removeprefix("file://"))
    return {str(p) for p in root.rglob("*") if p.is_file()}


def test_snapshot_expiry_keeps_the_current_snapshot_and_its_offsets(spark, spark_cluster, sh, catalog, location):
    topic = sh.topic_name("expire")
    sh.create_topic(spark_cluster.bootstrap, topic)
    total = 0
    for rnd in range(3):
        sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, b"%d-%d" % (rnd, i), [], 0) for i in range(10)])
        total += 10
        spark_cluster.wait_uploaded(topic, total)
        [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
        assert r.status == "committed"
    table = catalog.load_table(r.table)
    assert len(table.snapshots()) == 3
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False, expire_snapshots_ms=0)
    assert (r.status, r.expired_snapshots) == ("up-to-date", 2)
    table = catalog.load_table(r.table)
    assert len(table.snapshots()) == 1
    assert iceberg.committed_offsets(table) == {0: 30}
    assert sorted(table.scan().to_arrow()["offset"].to_pylist()) == list(range(30))


def test_small_files_are_rewritten_atomically_with_offsets_kept(spark, spark_cluster, sh, catalog, location):
    from automq.spark.lakecompact import compact_files

    topic = sh.topic_name("files")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2)
    total = 0
    for rnd in range(4):  # every run commits at least one small file per partition
        sh.produce_confluent(
            spark_cluster.bootstrap, topic, [(f"k{i}".encode(), b"%d-%d" % (rnd, i), [], 0) for i in range(20)]
        )
        total += 20
        spark_cluster.wait_uploaded(topic, total)
        [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
        assert r.status == "committed"
    table = catalog.load_table(r.table)
    before_rows = _table_rows(table)
    before_files = _data_files(table)
    offsets = iceberg.committed_offsets(table)
    assert len(before_rows) == total and len(before_files) >= 4 and sum(offsets.values()) == total

    # a compaction based on a snapshot that is no longer current loses and changes nothing
    stale = catalog.load_table(r.table)
    sh.produce_confluent(spark_cluster.bootstrap, topic, [(b"late", b"late", [], 0)])
    spark_cluster.wait_uploaded(topic, total + 1)
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r.status == "committed"
    assert compact_files(stale, 1 << 30).status == "lost"
    table = catalog.load_table(r.table)
    assert len(_table_rows(table)) == total + 1

    # through the ingestion run, as the CronJob does it: one commit, same rows, same offsets
    offsets = iceberg.committed_offsets(table)
    rows = _table_rows(table)
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False, compact_files_below=1 << 30)
    assert r.status == "up-to-date" and r.compacted_files >= 5
    table = catalog.load_table(r.table)
    assert _table_rows(table) == rows
    assert iceberg.committed_offsets(table) == offsets
    files = _data_files(table)
    assert len(files) <= 2  # one per Kafka partition's file group at most (unpartitioned table: one)
    assert duckdb.sql(f"select count(*) from read_parquet({files!r})").fetchall() == [(total + 1,)]
    assert pl.scan_iceberg(table).collect().height == total + 1
    # nothing is duplicated by the next ingestion run either
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r.status == "up-to-date" and len(_table_rows(catalog.load_table(r.table))) == total + 1
