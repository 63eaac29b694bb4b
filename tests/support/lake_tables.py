"""Reading lake tables back and producing a mix of records, for the lake ingestion tests
(tests/spark): shared by the sqlite- and the PostgreSQL-catalogued runs."""

from __future__ import annotations


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing on the way catches it."""


def competitor_commits_first(spark, location, catalog, topic: str) -> tuple:
    """A before_commit hook for ingest(): the first time it is called, another run ingests the
    topic and must commit (it wins the race). Returns (hook, the competitor's results)."""
    from automq.spark.ingest import ingest

    won: list = []

    def hook(name, table) -> None:
        if not won:
            won.extend(ingest(spark, location, catalog, [topic], enabled_topics=False))
            assert [r.status for r in won] == ["committed"], won

    return hook, won


def race_two_runs(spark, location, catalogs: list, topic: str, timeout: float = 240) -> tuple:
    """Two ingestion runs of `topic`, one per catalog client, that both write every file and
    then try to commit at the same moment (a barrier in before_commit, first attempt only: a
    loser's re-plan has nothing to wait for). Returns (winner's result, loser's result)."""
    import threading

    from automq.spark.ingest import ingest

    both_written = threading.Barrier(2, timeout=timeout)
    results: list = [None, None]

    def run(i: int) -> None:
        waited: list = []

        def commit_together(name, table) -> None:
            if not waited:
                waited.append(name)
                both_written.wait()

        results[i] = ingest(spark, location, catalogs[i], [topic], enabled_topics=False, before_commit=commit_together)

    runs = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in runs:
        t.start()
    for t in runs:
        t.join(600)
    [a], [b] = results
    return (a, b) if a.status == "committed" else (b, a)


def table_rows(table) -> list[tuple]:
    """(partition, offset, timestamp ms, key, value, headers) of every row of a raw table, as
    tests/spark/conftest.py's consume_all returns what a consumer reads."""
    rows = table.scan().to_arrow().sort_by([("partition", "ascending"), ("offset", "ascending")]).to_pylist()
    return [
        (
            r["partition"],
            r["offset"],
            int(r["timestamp"].timestamp() * 1000 + 0.5),
            r["key"],
            r["value"],
            [(h["key"], h["value"]) for h in r["headers"] or []],
        )
        for r in rows
    ]


def data_files(table) -> list[str]:
    """Local paths of the current snapshot's data files (what DuckDB reads)."""
    return [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]


def assert_read_back(table, expected: list[tuple]) -> None:
    """The raw table's rows equal what a consumer read (`expected`, consume_all's tuples),
    through pyiceberg, DuckDB (the current snapshot's Parquet files) and Polars (scan_iceberg)."""
    import duckdb
    import polars as pl

    assert table_rows(table) == expected
    files = data_files(table)
    got = duckdb.sql(f'select "partition", "offset", "value" from read_parquet({files!r}) order by 1, 2').fetchall()
    assert got == [(p, o, v) for p, o, _, _, v, _ in expected]
    polars_rows = pl.scan_iceberg(table).select("partition", "offset").sort("partition", "offset").collect()
    assert polars_rows.rows() == [(p, o) for p, o, *_ in expected]


def produce_mix(sh, bootstrap: str, topic: str, n: int, tag: str) -> int:
    """n records per codec (none, gzip, snappy, lz4, zstd) over partitions 0 and 1, by
    confluent-kafka and kafka-python in turn, with null keys, null values and headers."""
    total = 0
    for i, codec in enumerate(("none", "gzip", "snappy", "lz4", "zstd")):
        recs = [
            (
                None if j % 9 == 0 else f"k{j}".encode(),
                None if j % 10 == 3 else f"{tag}-{codec}-{j}".encode(),
                [("trace", f"{j}".encode())] if j % 4 == 0 else [],
                j % 2,
            )
            for j in range(n)
        ]
        if i % 2:
            sh.produce_kafka_python(bootstrap, topic, recs, compression_type=None if codec == "none" else codec)
        else:
            sh.produce_confluent(bootstrap, topic, recs, **{"compression.type": codec})
        total += n
    return total


def produce_serialized(bootstrap: str, topic: str, serializer, values: list[tuple[int, object]]) -> dict[int, int]:
    """Produce (partition, value) pairs through confluent-kafka's `SerializingProducer` with a
    schema-registry value serializer (Avro, Protobuf, ...). Returns {partition: next offset}."""
    from confluent_kafka import SerializingProducer

    producer = SerializingProducer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "value.serializer": serializer}
    )
    ends: dict[int, int] = {}

    def done(err, msg):
        assert err is None, err
        ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    for partition, value in values:
        producer.produce(topic, value=value, partition=partition, on_delivery=done)
        producer.poll(0)
    assert producer.flush(60) == 0
    return ends
