"""Lake ingestion through an Iceberg REST catalog: pyiceberg's RestCatalog talking HTTP to
tests/support/iceberg_rest.py, a thin REST adapter over a sqlite SQL catalog (as Iceberg's own
iceberg-rest-fixture is over JDBC) that validates each commit's requirements and applies its
updates server-side with pyiceberg, answering 409 CommitFailedException when a requirement
fails. The table read back with pyiceberg, DuckDB and Polars equals what a Kafka consumer
reads; a rerun adds nothing; a run that loses the race to another run gets the server's 409 and
re-plans; the bearer token never reaches the executors' settings; `automq spark ingest` takes
the URI from AUTOMQ_SPARK_CATALOG and the token from --catalog-property; a catalog that refuses
the token or is not there fails the run at once, naming it without its password.

Not exercised: a production REST server (Polaris, Nessie, Unity, Glue, ...), OAuth token
exchange, credential vending, S3 remote signing."""

from __future__ import annotations

import json
import os
import pickle
import socket
import time
from pathlib import Path

import polars as pl
import pytest
from iceberg_rest import IcebergRestServer
from lake_tables import assert_read_back, competitor_commits_first, data_files, produce_mix, race_two_runs, table_rows
from pyiceberg.catalog.rest import RestCatalog
from typer.testing import CliRunner

from automq.broker.cli import app
from automq.spark import iceberg
from automq.spark.ingest import ingest

pytestmark = [pytest.mark.slow, pytest.mark.spark]

TOKEN = "rest-secret-token"


@pytest.fixture
def rest_server(tmp_path):
    with IcebergRestServer(tmp_path / "rest", token=TOKEN) as server:
        yield server


def test_raw_table_through_a_rest_catalog_exactly_once_and_conflicts_as_409(
    spark, spark_cluster, sh, location, rest_server
):
    catalog = iceberg.open_catalog(rest_server.uri, properties={"token": TOKEN})
    assert isinstance(catalog, RestCatalog)
    topic = sh.topic_name("rest")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2)
    total = produce_mix(sh, spark_cluster.bootstrap, topic, 20, "a")
    spark_cluster.wait_uploaded(topic, total)

    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r.status, r.records) == ("committed", total), r
    table = catalog.load_table(r.table)
    # the table lives in the server's catalog: its sqlite row points at the current metadata
    assert rest_server.catalog.load_table(r.table).metadata_location == table.metadata_location
    # pyiceberg copies the catalog's token (and its auth manager holding it) into every table's
    # FileIO settings; the executors' tasks get those settings without them
    assert table.io.properties["token"] == TOKEN
    # (pickled, as they travel to executors: the auth manager object would carry it)
    assert TOKEN.encode() not in pickle.dumps(iceberg.executor_io_properties(table))
    expected = sh.consume_all(spark_cluster.bootstrap, topic, total)
    assert len(expected) == total
    assert_read_back(table, expected)

    [again] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert again.status == "up-to-date"
    assert len(catalog.load_table(r.table).snapshots()) == 1

    # more data; another run commits first while this one holds its written files: this run's
    # commit gets the server's 409 (its assert-ref-snapshot-id fails) and it re-plans
    total += produce_mix(sh, spark_cluster.bootstrap, topic, 8, "b")
    spark_cluster.wait_uploaded(topic, total)
    conflicts_before = rest_server.commits.get(r.table, {}).get("conflict", 0)
    competitor, won = competitor_commits_first(spark, location, catalog, topic)
    [loser] = ingest(spark, location, catalog, [topic], enabled_topics=False, before_commit=competitor)
    assert won[0].records == total - len(expected)
    assert (loser.status, loser.attempts) == ("up-to-date", 2), loser
    assert rest_server.commits[r.table]["conflict"] == conflicts_before + 1

    table = catalog.load_table(r.table)
    expected = sh.consume_all(spark_cluster.bootstrap, topic, total)
    assert table_rows(table) == expected
    assert iceberg.committed_offsets(table) == {p: max(o for q, o, *_ in expected if q == p) + 1 for p in (0, 1)}
    assert len(table.snapshots()) == 2
    # the loser deleted the files its tasks wrote: the data files on disk are exactly the table's
    assert {str(p) for p in rest_server.warehouse.glob("**/*.parquet")} == set(data_files(table))


def test_ingest_command_with_a_rest_catalog_from_the_environment(spark, spark_cluster, sh, rest_server):
    """`automq spark ingest` as a CronJob runs it: URI in AUTOMQ_SPARK_CATALOG, the token in
    PYICEBERG_CATALOG__AUTOMQ__TOKEN (pyiceberg's own environment configuration, where a
    Secret puts it: never on the command line); a wrong token (here a catalog property, which
    wins) fails the run before Spark starts."""
    topic = sh.topic_name("restenv")
    sh.create_topic(spark_cluster.bootstrap, topic)
    sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, b"x%d" % i, [], 0) for i in range(25)])
    spark_cluster.wait_uploaded(topic, 25)
    args = ["spark", "ingest", "--data-dir", str(spark_cluster.data_dir), "--topic", topic, "--only"]
    env = {"AUTOMQ_SPARK_CATALOG": rest_server.uri, "PYICEBERG_CATALOG__AUTOMQ__TOKEN": TOKEN}

    refused = CliRunner().invoke(app, [*args, "--catalog-property", "token=not-the-token-42"], env=env)
    assert refused.exit_code == 1, refused.output
    assert f"catalog {rest_server.uri}: NotAuthorizedException" in refused.output
    assert "not-the-token-42" not in refused.output

    # in-process: the run reuses the test session's Spark instead of starting a JVM
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    [line] = [json.loads(x) for x in result.output.splitlines() if x.startswith("{")]
    assert (line["status"], line["records"], line["offsets"]) == ("committed", 25, {"0": 25})
    table = iceberg.open_catalog(rest_server.uri, properties={"token": TOKEN}).load_table(line["table"])
    assert sorted(table.scan().to_arrow()["value"].to_pylist()) == sorted(b"x%d" % i for i in range(25))
    assert rest_server.commits[line["table"]] == {"ok": 1}


def test_an_unreachable_rest_catalog_fails_the_run_naming_it_without_its_password(tmp_path):
    """No Spark, no cluster: the catalog is opened first; exit 1 and one line."""
    from automq.broker import local

    url = f"http://lake:s3cret@127.0.0.1:{local.free_port()}/catalog"
    args = ["spark", "ingest", "--object-store", "file:///nowhere"]
    result = CliRunner().invoke(app, args, env={"AUTOMQ_SPARK_CATALOG": url})
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"error: catalog {url.replace('s3cret', '***')}: cannot reach the server")
    assert "s3cret" not in result.output and "Traceback" not in result.output


def test_a_rest_catalog_that_never_answers_fails_the_run_after_its_timeout():
    """pyiceberg's REST client has no timeouts of its own: a server that accepts connections
    and never answers (here: a listening socket nobody reads) would hold the run forever. The
    job's catalog gives up after `rest.client.socket-timeout-ms` (Iceberg Java's setting)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(iceberg.CatalogError, match=f"catalog {url}: no answer from the server"):
            iceberg.open_catalog(url, properties={iceberg.REST_READ_TIMEOUT: "300"})


def test_json_table_widened_partitioned_and_maintained_through_a_rest_catalog(
    spark, spark_cluster, sh, location, rest_server
):
    """The other kinds of commit the job sends, each applied by the server: a JSON table made
    after inference and partitioned by one of its fields (a create, then a spec update), a
    dead-letter table, a new field widening the schema, then small-file compaction (an
    overwrite carrying the offsets forward), snapshot expiry and orphan removal."""
    catalog = iceberg.open_catalog(rest_server.uri, properties={"token": TOKEN})
    topic = sh.topic_name("restjson")
    configs = {
        "automq.table.topic.convert.value.type": "json",
        "automq.table.topic.errors.tolerance": "all",
        "automq.table.topic.partition.by": "bucket(id, 2)",
    }
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2, configs=configs)

    def rec(partition: int, doc: dict | bytes) -> tuple:
        return (None, doc if isinstance(doc, bytes) else json.dumps(doc).encode(), [], partition)

    first = [rec(i % 2, {"id": i, "a": f"a{i}"}) for i in range(10)] + [rec(0, b"not json")]
    ends = sh.produce_confluent(spark_cluster.bootstrap, topic, first)
    spark_cluster.wait_uploaded(topic, ends)
    [r1] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r1.status, r1.records, r1.dead_letters, r1.offsets) == ("committed", 10, 1, ends), r1
    table = catalog.load_table(r1.table)
    assert [str(f.transform) for f in table.spec().fields] == ["bucket[2]"]

    second = [rec(i % 2, {"id": 10 + i, "a": "later", "b": True}) for i in range(6)]
    ends = sh.produce_confluent(spark_cluster.bootstrap, topic, second)
    spark_cluster.wait_uploaded(topic, ends)
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r2.status, r2.records, r2.offsets) == ("committed", 6, ends), r2
    table = catalog.load_table(r1.table)
    assert str(table.schema().find_field("b").field_type) == "boolean"

    files = data_files(table)
    # a file nothing references, as a killed run leaves one, an hour old
    stray = Path(table.location().removeprefix("file://")) / "data" / "stray.parquet"
    stray.write_bytes(b"PAR1")
    os.utime(stray, (time.time() - 3600, time.time() - 3600))
    [m] = ingest(
        spark,
        location,
        catalog,
        [topic],
        enabled_topics=False,
        compact_files_below=1 << 30,
        expire_snapshots_ms=0,
        remove_orphans_ms=60_000,
    )
    assert (m.status, m.compacted_files) == ("up-to-date", len(files)), m
    assert m.expired_snapshots >= 2 and m.removed_files >= 1, m
    table = catalog.load_table(r1.table)
    assert len(table.snapshots()) == 1 and len(data_files(table)) < len(files)
    # the replaced files went with the expired snapshots, the stray one as an orphan
    assert not stray.exists()
    assert {str(p) for p in Path(table.location().removeprefix("file://")).glob("**/*.parquet")} == set(
        data_files(table)
    )
    assert iceberg.committed_offsets(table) == ends
    rows = sorted(table.scan().to_arrow().select(["id", "a", "b"]).to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": i, "a": f"a{i}", "b": None} for i in range(10)] + [
        {"id": 10 + i, "a": "later", "b": True} for i in range(6)
    ]
    assert pl.scan_iceberg(table).select("id").collect()["id"].sort().to_list() == list(range(16))
    [dead] = catalog.load_table(f"{r1.table}_dlq").scan().to_arrow().to_pylist()
    assert dead["value"] == b"not json" and dead["offset"] == 5
    # every commit the server answered was applied: no conflicts in a run without a competitor
    assert "conflict" not in rest_server.commits[r1.table]


def test_two_runs_racing_on_a_new_table_through_a_rest_catalog_commit_every_record_once(
    spark, spark_cluster, sh, location, rest_server
):
    """Two jobs (two RestCatalog clients) start at once on a topic with no table: both create
    the namespace and the table (one gets the server's 409 AlreadyExists and loads the other's),
    both write every record's files, then both commit at the same moment, concurrent requests
    on the server. One commit wins; the other gets 409 CommitFailed, re-plans from the winner's
    offsets, finds nothing left and deletes the files it wrote."""
    topic = sh.topic_name("restrace")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2)
    ends = sh.produce_confluent(
        spark_cluster.bootstrap, topic, [(b"k%d" % i, b"v%d" % i, [], i % 2) for i in range(200)]
    )
    spark_cluster.wait_uploaded(topic, ends)
    catalogs = [iceberg.open_catalog(rest_server.uri, properties={"token": TOKEN}) for _ in range(2)]
    winner, loser = race_two_runs(spark, location, catalogs, topic, timeout=120)
    assert (winner.status, winner.records, winner.offsets) == ("committed", 200, ends), (winner, loser)
    assert (loser.status, loser.attempts) == ("up-to-date", 2), (winner, loser)
    assert rest_server.commits[winner.table] == {"ok": 1, "conflict": 1}

    table = catalogs[0].load_table(winner.table)
    assert len(table.snapshots()) == 1
    assert table_rows(table) == sh.consume_all(spark_cluster.bootstrap, topic, 200)
    assert iceberg.committed_offsets(table) == ends
    assert {str(p) for p in rest_server.warehouse.glob("**/*.parquet")} == set(data_files(table))
