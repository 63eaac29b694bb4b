"""`automq.table.topic.partition.by` changed on a topic whose table already exists: the next
run evolves the table's partition spec (fields added and removed in one metadata commit), its
new files carry the new spec's partition values, the old files keep theirs, and pyiceberg,
DuckDB and Polars read every record exactly once, as a Kafka consumer reads them. A
partition.by the table cannot take fails the run naming the setting and changes nothing."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest
from lake_tables import Crash, competitor_commits_first

from automq.spark import iceberg
from automq.spark.ingest import ingest

pytestmark = [pytest.mark.slow, pytest.mark.spark]

PARTITION_BY = "automq.table.topic.partition.by"


def _alter(bootstrap: str, topic: str, value: str | None) -> None:
    """kafka-configs' path: IncrementalAlterConfigs, SET or DELETE of partition.by."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    entry = ConfigEntry(PARTITION_BY, value or "", incremental_operation=op)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: a collected client cancels its futures
    admin.incremental_alter_configs([resource])[resource].result(30)


def _files(table) -> list:
    return [t.file for t in table.scan().plan_files()]


def test_partition_by_changes_evolve_the_spec_of_an_existing_table(spark, spark_cluster, sh, catalog, location):
    topic = sh.topic_name("respec")
    configs = {"automq.table.topic.enable": "true", "automq.table.topic.convert.value.type": "string"}
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2, configs=configs)
    produced = 0

    def produce_and_ingest(tag: str, before_commit=None):
        nonlocal produced
        recs = [(f"k{i}".encode(), f"{tag}-{i}".encode(), [], i % 2) for i in range(8)]
        sh.produce_confluent(spark_cluster.bootstrap, topic, recs)
        produced += len(recs)
        spark_cluster.wait_uploaded(topic, produced)
        [r] = ingest(spark, location, catalog, [topic], enabled_topics=False, before_commit=before_commit)
        return r

    r = produce_and_ingest("plain")
    assert r.status == "committed", r
    table = catalog.load_table(r.table)
    assert table.spec().is_unpartitioned()
    first_files = {f.file_path for f in _files(table)}

    # set: the next run's files are partitioned, the first run's stay as they were written
    _alter(spark_cluster.bootstrap, topic, "partition, day(timestamp)")

    def crash(name, table):
        raise Crash()

    # the run dies after the spec's metadata commit and its files, before its data commit: the
    # rerun resumes from the offsets the table still holds and writes with the new spec
    with pytest.raises(Crash):
        produce_and_ingest("daily", before_commit=crash)
    table = catalog.load_table(r.table)
    assert not table.spec().is_unpartitioned() and iceberg.committed_offsets(table) == {0: 4, 1: 4}
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r.status, r.records) == ("committed", 8), r
    table = catalog.load_table(r.table)
    daily = table.spec()
    assert [(f.name, str(f.transform)) for f in daily.fields] == [
        ("partition_identity", "identity"),
        ("timestamp_day", "day"),
    ]
    new = [f for f in _files(table) if f.file_path not in first_files]
    assert new and all(f.spec_id == daily.spec_id for f in new)
    assert sorted(f.partition[0] for f in new) == [0, 1]  # one file per Kafka partition, its value
    assert all(f.spec_id != daily.spec_id for f in _files(table) if f.file_path in first_files)
    # the table's partition pruning works across both specs
    assert pl.scan_iceberg(table).filter(pl.col("partition") == 1).collect().height == produced // 2

    # changed: identity and day go, bucket comes
    _alter(spark_cluster.bootstrap, topic, "bucket(offset, 3)")
    r = produce_and_ingest("bucketed")
    assert r.status == "committed", r
    table = catalog.load_table(r.table)
    bucketed = table.spec()
    assert [str(f.transform) for f in bucketed.fields] == ["bucket[3]"]
    assert {f.spec_id for f in _files(table)} == {0, daily.spec_id, bucketed.spec_id}

    # a bucket without its number never gets to the job: the broker refuses it, naming the key
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException, match=PARTITION_BY):
        _alter(spark_cluster.bootstrap, topic, "bucket(offset)")

    # a transform the column's type does not take: the run fails naming the setting, the table
    # (spec, snapshot, offsets) stays as it was
    _alter(spark_cluster.bootstrap, topic, "day(offset)")
    snapshot = table.current_snapshot()
    r = produce_and_ingest("refused")
    assert r.status == "failed" and PARTITION_BY in r.message and "offset" in r.message, r
    table = catalog.load_table(r.table)
    assert table.spec() == bucketed and table.current_snapshot() == snapshot
    _alter(spark_cluster.bootstrap, topic, "region")  # a column the table lacks
    r = produce_and_ingest("refused-again")
    assert r.status == "failed" and PARTITION_BY in r.message and "'region'" in r.message, r
    assert catalog.load_table(r.table).spec() == bucketed

    # removed: the next files are unpartitioned, and the refused runs' records come once
    _alter(spark_cluster.bootstrap, topic, None)
    r = produce_and_ingest("plain-again")
    assert r.status == "committed" and r.records == 24, r
    table = catalog.load_table(r.table)
    assert table.spec().is_unpartitioned()
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r.status == "up-to-date"

    consumed = sorted(
        (p, o, k, v.decode()) for p, o, _ts, k, v, _h in sh.consume_all(spark_cluster.bootstrap, topic, produced)
    )
    assert len(consumed) == produced == 48
    assert iceberg.committed_offsets(table) == {0: produced // 2, 1: produced // 2}
    cols = ["partition", "offset", "key", "value"]
    rows = table.scan(selected_fields=tuple(cols)).to_arrow().to_pylist()
    assert sorted(tuple(r[c] for c in cols) for r in rows) == consumed
    assert sorted(pl.scan_iceberg(table).select(cols).collect().rows()) == consumed
    paths = [f.file_path for f in _files(table)]
    quoted = ", ".join(f'"{c}"' for c in cols)
    assert sorted(duckdb.sql(f"select {quoted} from read_parquet({paths!r})").fetchall()) == consumed


def test_a_json_field_that_arrives_with_the_run_partitions_the_next_runs_files(
    spark, spark_cluster, sh, catalog, location
):
    """partition.by on a JSON field the table has not got yet: the run that brings the field
    commits with the old spec (one spec per commit) and evolves it right after."""
    topic = sh.topic_name("respec-json")
    configs = {"automq.table.topic.enable": "true", "automq.table.topic.convert.value.type": "json"}
    sh.create_topic(spark_cluster.bootstrap, topic, configs=configs)
    produced = 0

    def produce_and_ingest(docs: list[bytes]):
        nonlocal produced
        sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, d, [], 0) for d in docs])
        produced += len(docs)
        spark_cluster.wait_uploaded(topic, produced)
        [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
        assert r.status == "committed", r
        return catalog.load_table(r.table)

    table = produce_and_ingest([b'{"a": 1}'])
    _alter(spark_cluster.bootstrap, topic, "bucket(b, 2)")
    table = produce_and_ingest([b'{"a": 2, "b": 5}'])
    assert [str(f.transform) for f in table.spec().fields] == ["bucket[2]"]
    assert {f.spec_id for f in _files(table)} == {0}  # this run's file: the spec it planned with
    table = produce_and_ingest([b'{"a": 3, "b": 6}', b'{"a": 4, "b": 7}'])
    assert {f.spec_id for f in _files(table)} == {0, table.spec().spec_id}
    assert sorted(pl.scan_iceberg(table).select("a", "b").collect().rows(), key=lambda r: r[0]) == [
        (1, None),
        (2, 5),
        (3, 6),
        (4, 7),
    ]


def test_a_spec_changed_by_another_run_between_plan_and_commit(spark, spark_cluster, sh, tmp_path, catalog, location):
    """Another run evolves the spec (and dies before its commit) while this run, planned and
    written with the old spec, is about to commit: its files stay under their own spec in
    the snapshot (nothing misread), and the next run writes with the new one. And a run that
    loses its commit to a run that evolved the spec re-plans and writes nothing twice."""
    topic = sh.topic_name("respec-race")
    configs = {"automq.table.topic.enable": "true", "automq.table.topic.convert.value.type": "string"}
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2, configs=configs)
    produced = 0

    def produce(tag: str) -> None:
        nonlocal produced
        recs = [(None, f"{tag}-{i}".encode(), [], i % 2) for i in range(6)]
        sh.produce_confluent(spark_cluster.bootstrap, topic, recs)
        produced += len(recs)
        spark_cluster.wait_uploaded(topic, produced)

    def evolve_elsewhere(name, table):
        other = catalog.load_table(name)  # what a concurrent run with the new setting does first
        assert iceberg.evolve_partition_spec(other, name, (("identity", "partition", None),))

    produce("a")
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False, before_commit=evolve_elsewhere)
    assert r.status == "committed", r
    table = catalog.load_table(r.table)
    assert [f.name for f in table.spec().fields] == ["partition_identity"]
    assert {f.spec_id for f in _files(table)} == {0}
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert {m.partition_spec_id for m in snapshot.manifests(table.io)} == {0}

    _alter(spark_cluster.bootstrap, topic, "partition")
    produce("b")
    _alter(spark_cluster.bootstrap, topic, "partition, bucket(offset, 2)")
    produce("c")
    competitor, _won = competitor_commits_first(spark, location, catalog, topic)
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False, before_commit=competitor)
    assert (r.status, r.attempts) == ("up-to-date", 2), r
    table = catalog.load_table(r.table)
    assert [str(f.transform) for f in table.spec().fields] == ["identity", "bucket[2]"]
    assert {f.spec_id for f in _files(table)} == {0, table.spec().spec_id}
    warehouse = {str(p) for p in tmp_path.glob("lake/**/*.parquet")}
    assert warehouse == {f.file_path.removeprefix("file://") for f in _files(table)}  # the loser's files went
    got = sorted(pl.scan_iceberg(table).select("partition", "offset", "value").collect().rows())
    assert len(got) == produced == 18 and len(set(got)) == produced
    assert iceberg.committed_offsets(table) == {0: produced // 2, 1: produced // 2}


def test_an_upsert_table_evolves_its_spec_and_still_replaces_the_right_rows(
    spark, spark_cluster, sh, catalog, location
):
    """Debezium upserts into a table whose spec changed: the new images and the copy-on-write
    rewrites of old files are written with the new spec, the untouched old files keep theirs."""
    import json

    topic = sh.topic_name("respec-cdc")
    configs = {
        "automq.table.topic.enable": "true",
        "automq.table.topic.convert.value.type": "json",
        "automq.table.topic.transform.value.type": "flatten_debezium",
        "automq.table.topic.id.columns": "id",
    }
    sh.create_topic(spark_cluster.bootstrap, topic, configs=configs)

    def env(op, before, after):
        return (None, json.dumps({"payload": {"op": op, "before": before, "after": after}}).encode(), [], 0)

    first = [env("c", None, {"id": i, "name": f"v{i}"}) for i in range(6)]
    sh.produce_confluent(spark_cluster.bootstrap, topic, first)
    spark_cluster.wait_uploaded(topic, len(first))
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r.status == "committed", r
    old_files = {f.file_path for f in _files(catalog.load_table(r.table))}

    _alter(spark_cluster.bootstrap, topic, "bucket(id, 2)")
    second = [
        env("u", {"id": 1, "name": "v1"}, {"id": 1, "name": "v1b"}),
        env("d", {"id": 2, "name": "v2"}, None),
        env("c", None, {"id": 9, "name": "v9"}),
    ]
    sh.produce_confluent(spark_cluster.bootstrap, topic, second)
    spark_cluster.wait_uploaded(topic, len(first) + len(second))
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r.status == "committed", r
    table = catalog.load_table(r.table)
    spec = table.spec()
    assert [str(f.transform) for f in spec.fields] == ["bucket[2]"]
    new = [f for f in _files(table) if f.file_path not in old_files]
    assert new and all(f.spec_id == spec.spec_id for f in new)
    assert all(f.spec_id == 0 for f in _files(table) if f.file_path in old_files)
    expected = [(0, "v0"), (1, "v1b"), (3, "v3"), (4, "v4"), (5, "v5"), (9, "v9")]
    assert sorted((x["id"], x["name"]) for x in table.scan().to_arrow().to_pylist()) == expected
    assert sorted(pl.scan_iceberg(table).select("id", "name").collect().rows()) == expected
    paths = [f.file_path for f in _files(table)]
    assert sorted(duckdb.sql(f"select id, name from read_parquet({paths!r})").fetchall()) == expected


def test_a_spec_changed_while_the_run_widens_the_schema_makes_it_replan(
    spark, spark_cluster, sh, tmp_path, catalog, location, monkeypatch
):
    """JSON: a task that met no new column wrote with the run's spec; another run evolves the
    spec while this one widens the schema (which reloads the table's metadata): one commit
    would list files of two specs under one, so the run deletes its files and re-plans."""
    from automq.spark import ingest as ingest_module
    from automq.spark import lakewrite

    topic = sh.topic_name("respec-widen")
    configs = {"automq.table.topic.enable": "true", "automq.table.topic.convert.value.type": "json"}
    sh.create_topic(spark_cluster.bootstrap, topic, configs=configs)
    sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, b'{"a": 1}', [], 0)])
    spark_cluster.wait_uploaded(topic, 1)
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r.status == "committed", r
    # two uploads, one task each: the first task's records fit the table, the second's do not
    sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, b'{"a": 2}', [], 0)])
    spark_cluster.wait_uploaded(topic, 2)
    sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, b'{"a": 3, "b": "x"}', [], 0)])
    spark_cluster.wait_uploaded(topic, 3)
    monkeypatch.setattr(lakewrite, "task_groups", lambda slices, parallelism, max_bytes: [[sl] for sl in slices])
    real_evolve = ingest_module.lakeschema.evolve
    evolved = []

    def evolve_while_another_run_changes_the_spec(table, schemas):
        if not evolved:
            evolved.append(table.name())
            other = catalog.load_table(r.table)
            assert iceberg.evolve_partition_spec(other, r.table, (("identity", "a", None),))
        real_evolve(table, schemas)

    monkeypatch.setattr(ingest_module.lakeschema, "evolve", evolve_while_another_run_changes_the_spec)
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert evolved and (r2.status, r2.attempts, r2.records) == ("committed", 2, 2), r2
    table = catalog.load_table(r.table)
    assert table.spec().is_unpartitioned()  # this run's setting (none) wins again on its second try
    assert sorted(pl.scan_iceberg(table).select("a", "b").collect().rows(), key=lambda x: x[0]) == [
        (1, None),
        (2, None),
        (3, "x"),
    ]
    on_disk = {str(p) for p in tmp_path.glob("lake/**/*.parquet")}
    assert on_disk == {f.file_path.removeprefix("file://") for f in _files(table)}  # the first try's went
