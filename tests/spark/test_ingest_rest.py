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
import pickle

import pytest
from iceberg_rest import IcebergRestServer
from lake_tables import assert_read_back, competitor_commits_first, data_files, produce_mix, table_rows
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
    assert type(catalog).__name__ == "RestCatalog"
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
    """`automq spark ingest` as the CronJob runs it: URI in AUTOMQ_SPARK_CATALOG, the token as
    a catalog property; a wrong token fails the run before Spark starts."""
    topic = sh.topic_name("restenv")
    sh.create_topic(spark_cluster.bootstrap, topic)
    sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, b"x%d" % i, [], 0) for i in range(25)])
    spark_cluster.wait_uploaded(topic, 25)
    args = ["spark", "ingest", "--data-dir", str(spark_cluster.data_dir), "--topic", topic, "--only"]
    env = {"AUTOMQ_SPARK_CATALOG": rest_server.uri}

    refused = CliRunner().invoke(app, [*args, "--catalog-property", "token=not-the-token-42"], env=env)
    assert refused.exit_code == 1, refused.output
    assert f"catalog {rest_server.uri}: NotAuthorizedException" in refused.output
    assert "not-the-token-42" not in refused.output

    # in-process: the run reuses the test session's Spark instead of starting a JVM
    result = CliRunner().invoke(app, [*args, "--catalog-property", f"token={TOKEN}"], env=env)
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
