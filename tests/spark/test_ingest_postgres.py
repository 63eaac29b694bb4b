"""Lake ingestion with its Iceberg catalog in a real PostgreSQL server (pyiceberg's SQL
catalog over psycopg 3), where catalog transactions really run concurrently: the table read
back with pyiceberg, DuckDB and Polars equals what a Kafka consumer reads; a rerun adds
nothing; a run killed between writing its files and committing, rerun, gives every record
once, and its commit lands though the server dropped the run's idle connections; small-file
compaction and snapshot expiry keep rows and offsets; two runs
racing on a new table (and on a fresh catalog database) commit every record once; the URI
can come from AUTOMQ_SPARK_CATALOG, in libpq's plain `postgresql://` form.

The sqlite-catalogued versions of these are in test_ingest.py; the catalog is the only
difference here."""

from __future__ import annotations

import json
import threading

import pyarrow as pa
import pytest
from lake_tables import Crash, assert_read_back, data_files, produce_mix, race_two_runs, table_rows
from typer.testing import CliRunner

from automq.broker.cli import app
from automq.spark import iceberg
from automq.spark.ingest import ingest

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture
def database(postgres):
    name = postgres.create_database("lake")
    yield name
    postgres.drop_database(name)


def _catalog_rows(postgres, database: str) -> list[tuple]:
    return postgres.execute(
        "select table_namespace, table_name, metadata_location from iceberg_tables order by 2", database
    )


def _dispose(*catalogs) -> None:
    for c in catalogs:
        c.engine.dispose()  # the pooled connections, so the database can be dropped


def test_raw_table_in_a_postgres_catalog_exactly_once(spark, spark_cluster, sh, postgres, database, location, tmp_path):
    catalog = iceberg.open_catalog(postgres.url(database, password="db-secret"), str(tmp_path / "warehouse"))
    topic = sh.topic_name("pg")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2)
    total = produce_mix(sh, spark_cluster.bootstrap, topic, 30, "a")
    spark_cluster.wait_uploaded(topic, total)

    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r.status, r.records) == ("committed", total), r
    table = catalog.load_table(r.table)
    # pyiceberg copies the catalog's URI, password included, into the table's FileIO settings;
    # the executors' tasks get those settings without it
    assert "db-secret" in table.io.properties["uri"]
    assert "db-secret" not in json.dumps(iceberg.executor_io_properties(table))
    # the table lives in PostgreSQL: its row there points at the current metadata file
    assert _catalog_rows(postgres, database) == [("kafka", r.table.split(".")[1], table.metadata_location)]
    expected = sh.consume_all(spark_cluster.bootstrap, topic, total)
    assert len(expected) == total
    assert_read_back(table, expected)

    # more data; a run dies after writing its files, before its commit: the table is unchanged
    total += produce_mix(sh, spark_cluster.bootstrap, topic, 10, "b")
    spark_cluster.wait_uploaded(topic, total)
    metadata_before = table.metadata_location

    def die(name, table):
        raise Crash()

    with pytest.raises(Crash):
        ingest(spark, location, catalog, [topic], enabled_topics=False, before_commit=die)
    assert catalog.load_table(r.table).metadata_location == metadata_before
    assert table_rows(catalog.load_table(r.table)) == expected

    # the rerun writes that range once, though the server drops the run's pooled connections
    # while its tasks write (an idle timeout, a proxy, a failover): its commit opens a live one
    terminated = []

    def server_drops_idle_connections(name, table):
        terminated.extend(
            postgres.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity "
                f"where datname = '{database}' and pid <> pg_backend_pid()"
            )
        )

    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False, before_commit=server_drops_idle_connections)
    assert terminated and all(ok for (ok,) in terminated)
    assert (r2.status, r2.records, r2.attempts) == ("committed", total - len(expected), 1), r2
    expected = sh.consume_all(spark_cluster.bootstrap, topic, total)
    assert table_rows(catalog.load_table(r.table)) == expected

    # a rerun adds nothing, and a new catalog (another job) sees the same table and offsets
    [again] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert again.status == "up-to-date"
    other = iceberg.open_catalog(postgres.url(database), str(tmp_path / "warehouse"))
    table = other.load_table(r.table)
    assert table_rows(table) == expected
    assert iceberg.committed_offsets(table) == {p: max(o for q, o, *_ in expected if q == p) + 1 for p in (0, 1)}
    assert len(table.snapshots()) == 2

    # the table maintenance commits go through the same catalog row: small files rewritten
    # (offsets carried forward), then every snapshot but the current one expired
    offsets, files = iceberg.committed_offsets(table), data_files(table)
    [m] = ingest(
        spark, location, other, [topic], enabled_topics=False, compact_files_below=1 << 30, expire_snapshots_ms=0
    )
    assert (m.status, m.compacted_files, m.expired_snapshots) == ("up-to-date", len(files), 2), m
    table = other.load_table(r.table)
    assert table_rows(table) == expected and iceberg.committed_offsets(table) == offsets
    assert len(table.snapshots()) == 1 and len(data_files(table)) < len(files)
    assert _catalog_rows(postgres, database)[0][2] == table.metadata_location
    _dispose(catalog, other)


def test_two_runs_racing_on_a_new_table_commit_every_record_once(
    spark, spark_cluster, sh, postgres, database, location, tmp_path
):
    """Two jobs start at once against a fresh catalog database and a topic with no table yet:
    both create the catalog's tables, the namespace and the table, both write every record's
    files, then both commit at the same moment (real concurrent PostgreSQL transactions on
    the table's catalog row). One commit wins; the other re-plans from the winner's offsets
    and finds nothing left, and deletes the files it wrote."""
    topic = sh.topic_name("pgrace")
    sh.create_topic(spark_cluster.bootstrap, topic, partitions=2)
    ends = sh.produce_confluent(
        spark_cluster.bootstrap, topic, [(b"k%d" % i, b"v%d" % i, [], i % 2) for i in range(200)]
    )
    spark_cluster.wait_uploaded(topic, ends)
    warehouse = str(tmp_path / "warehouse")

    catalogs: list = [None, None]
    opened = threading.Barrier(2, timeout=60)

    def open_at_once(i: int) -> None:
        opened.wait()
        catalogs[i] = iceberg.open_catalog(postgres.url(database), warehouse)

    openers = [threading.Thread(target=open_at_once, args=(i,)) for i in (0, 1)]
    for t in openers:
        t.start()
    for t in openers:
        t.join(120)
    assert all(catalogs), "opening the catalog failed (see the log)"

    winner, loser = race_two_runs(spark, location, catalogs, topic, timeout=240)
    assert (winner.status, winner.records, winner.offsets) == ("committed", 200, ends), (winner, loser)
    assert (loser.status, loser.attempts) == ("up-to-date", 2), (winner, loser)

    table = catalogs[0].load_table(winner.table)
    assert len(table.snapshots()) == 1
    expected = sh.consume_all(spark_cluster.bootstrap, topic, 200)
    assert table_rows(table) == expected
    assert iceberg.committed_offsets(table) == ends
    assert _catalog_rows(postgres, database) == [("kafka", winner.table.split(".")[1], table.metadata_location)]
    # the loser deleted its files: the data files on disk are exactly the table's
    assert {str(p) for p in (tmp_path / "warehouse").glob("**/*.parquet")} == set(data_files(table))
    _dispose(*catalogs)


def test_catalog_uri_from_the_environment(spark, spark_cluster, sh, postgres, database, tmp_path):
    """`automq spark ingest` as the CronJob runs it with `catalogUriSecret`: the URI (libpq's
    plain form, as a Secret holds it) in AUTOMQ_SPARK_CATALOG; a server catalog without
    --warehouse is refused before Spark starts."""
    topic = sh.topic_name("pgenv")
    sh.create_topic(spark_cluster.bootstrap, topic)
    sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, b"x%d" % i, [], 0) for i in range(25)])
    spark_cluster.wait_uploaded(topic, 25)
    url = postgres.url(database, driver="")
    assert url.startswith("postgresql://")
    args = ["spark", "ingest", "--data-dir", str(spark_cluster.data_dir), "--topic", topic, "--only"]

    refused = CliRunner().invoke(app, args, env={"AUTOMQ_SPARK_CATALOG": url})
    assert refused.exit_code == 2 and "needs --warehouse" in refused.output, refused.output

    warehouse = str(tmp_path / "warehouse")
    # in-process: the run reuses the test session's Spark instead of starting a JVM
    result = CliRunner().invoke(app, [*args, "--warehouse", warehouse], env={"AUTOMQ_SPARK_CATALOG": url})
    assert result.exit_code == 0, result.output
    [line] = [json.loads(x) for x in result.output.splitlines() if x.startswith("{")]
    assert (line["status"], line["records"], line["offsets"]) == ("committed", 25, {"0": 25})
    catalog = iceberg.open_catalog(url, warehouse)
    table = catalog.load_table(line["table"])
    assert sorted(table.scan().to_arrow()["value"].to_pylist()) == sorted(b"x%d" % i for i in range(25))
    assert [row[1] for row in _catalog_rows(postgres, database)] == [line["table"].split(".")[1]]
    _dispose(catalog)


def test_jobs_opening_a_fresh_catalog_and_creating_one_table_at_once(postgres, database, tmp_path):
    """Four jobs start together on an empty database: each creates the catalog's tables, the
    namespace and the same table, racing between pyiceberg's existence checks and its INSERTs
    and CREATE TABLEs. Every one opens the catalog and gets the one table."""
    n = 4
    together = threading.Barrier(n, timeout=60)
    got: list = [None] * n
    catalogs: list = [None] * n

    def job(i: int) -> None:
        try:
            together.wait()
            catalogs[i] = iceberg.open_catalog(postgres.url(database), str(tmp_path / "warehouse"))
            together.wait()
            got[i] = iceberg.create_table(catalogs[i], "kafka.orders", pa.schema([("v", pa.string())]), "orders")
        except Exception as exc:
            got[i] = exc

    threads = [threading.Thread(target=job, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    errors = [g for g in got if not hasattr(g, "metadata_location")]
    assert not errors, errors
    [(namespace, name, location)] = _catalog_rows(postgres, database)
    assert (namespace, name) == ("kafka", "orders")
    assert {t.metadata_location for t in got} == {location}
    assert postgres.execute("select namespace, property_key from iceberg_namespace_properties", database) == [
        ("kafka", "exists")
    ]
    _dispose(*[c for c in catalogs if c is not None])


def test_an_unreachable_catalog_fails_the_run_at_once_naming_it_without_its_password(tmp_path):
    """No Spark, no cluster: the catalog is opened first. A server that is not there fails the
    run with exit 1 and one line naming the URI, password masked (the CronJob's log is read by
    people who must not learn it); libpq's URL gets a connect timeout (an unreachable host
    would otherwise hang for the kernel's TCP timeout)."""
    from automq.broker import local

    url = f"postgresql://lake:s3cret@127.0.0.1:{local.free_port()}/lake"
    assert iceberg.sql_url(url).endswith(f"/lake?connect_timeout={iceberg.CONNECT_TIMEOUT_S}")
    assert iceberg.sql_url(url + "?connect_timeout=3").endswith("?connect_timeout=3")
    args = ["spark", "ingest", "--object-store", "file:///nowhere", "--warehouse", str(tmp_path / "wh")]
    result = CliRunner().invoke(app, args, env={"AUTOMQ_SPARK_CATALOG": url})
    assert result.exit_code == 1, result.output
    assert "error: catalog postgresql://lake:***@127.0.0.1" in result.output
    assert "Connection refused" in result.output and "s3cret" not in result.output


def test_catalog_uris_in_messages_hide_secrets_in_the_query_string_too():
    uri = "postgresql://lake:s3cret@db:5432/lake?sslpassword=k3y&application_name=ingest&Token=t0k"
    shown = iceberg.masked(uri)  # SQLAlchemy renders the query sorted
    assert shown.startswith("postgresql://lake:***@db:5432/lake?")
    assert sorted(shown.split("?")[1].split("&")) == ["Token=***", "application_name=ingest", "sslpassword=***"]
    assert iceberg.masked("https://rest:8181/?credential=id:s3cret") == "https://rest:8181/?credential=***"
    assert iceberg.masked("postgresql://db/lake?password=s3cret") == "postgresql://db/lake?password=***"


def test_a_user_who_may_not_create_the_catalog_tables_gets_the_servers_reason(postgres, database, tmp_path):
    """PostgreSQL 15 lets only the database owner create tables in `public`: a job whose user
    is not the owner, on a database nobody prepared, fails at once with the server's reason."""
    role = f"job_{database[-8:]}"
    postgres.execute(f"create role {role} login")
    url = postgres.url(database).replace("automq@", f"{role}@")
    with pytest.raises(iceberg.CatalogError, match="permission denied for schema public") as failed:
        iceberg.open_catalog(url, str(tmp_path / "warehouse"))
    assert f"postgresql+psycopg://{role}@127.0.0.1" in str(failed.value)
    # once the owner made the tables (the first job, or a DBA), that user can work with them
    owner = iceberg.open_catalog(postgres.url(database), str(tmp_path / "warehouse"))
    postgres.execute(f"grant select, insert, update, delete on all tables in schema public to {role}", database)
    job = iceberg.open_catalog(url, str(tmp_path / "warehouse"))
    table = iceberg.create_table(job, "kafka.t", pa.schema([("v", pa.string())]), "t")
    assert owner.load_table("kafka.t").metadata_location == table.metadata_location
    _dispose(owner, job)
