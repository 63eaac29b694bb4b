"""Transactional topics in the Spark jobs, against a real broker's transactions (confluent-kafka's
transactional producer): the data source shows what a read_committed consumer shows (no
markers, no aborted records), and ingestion stops each partition at an open transaction (its
last stable offset) and picks the rest up, exactly once, after the transaction commits."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from automq.spark import iceberg, lakewrite
from automq.spark.cluster import ClusterLocation
from automq.spark.ingest import ingest

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def _values(tag: str, n: int = 4) -> list[bytes]:
    return [f"{tag}{i}".encode() for i in range(n)]


def _high_watermark(bootstrap: str, topic: str) -> int:
    # read_uncommitted: librdkafka's default (read_committed) answers the last stable offset,
    # which stops short of an open transaction's records
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw", "isolation.level": "read_uncommitted"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
    finally:
        c.close()


def _read_committed(bootstrap: str, topic: str, n: int) -> list[bytes]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"rc-{topic}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    try:
        for _ in range(120):
            if len(out) >= n:
                break
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(msg.value())
    finally:
        c.close()
    return out


def test_read_committed_rows_and_ingest_up_to_the_open_transaction(
    spark, spark_cluster, sh, tmp_path, monkeypatch, caplog
):
    # every object slice its own executor task: the task holding the open transaction cuts its
    # own rows, the driver drops (and deletes) the files of the tasks after it
    monkeypatch.setattr(lakewrite, "task_groups", lambda slices, parallelism, max_bytes: [[sl] for sl in slices])
    bootstrap = spark_cluster.bootstrap
    topic = sh.topic_name("txn")
    sh.create_topic(bootstrap, topic)

    def plain(tag: str) -> None:
        sh.produce_confluent(bootstrap, topic, [(None, v, [], 0) for v in _values(tag)])

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic, "transaction.timeout.ms": 300_000})
    producer.init_transactions(60)

    def transaction(tag: str, end: str | None) -> None:
        producer.begin_transaction()
        for v in _values(tag):
            producer.produce(topic, value=v, partition=0)
        producer.flush(30)
        if end == "commit":
            producer.commit_transaction(60)
        elif end == "abort":
            producer.abort_transaction(60)

    plain("a")
    transaction("b", "commit")
    transaction("c", "abort")
    plain("d")
    transaction("e", None)  # stays open
    spark_cluster.wait_uploaded(topic, {0: _high_watermark(bootstrap, topic)})  # f in a later object
    plain("f")
    spark_cluster.wait_uploaded(topic, {0: _high_watermark(bootstrap, topic)})

    df = spark.read.format("automq").option("topic", topic).option("dataDir", str(spark_cluster.data_dir)).load()
    rows = df.orderBy("offset").collect()
    # markers are not rows, aborted records are gone, the open transaction's are not shown yet
    assert [bytes(r.value) for r in rows] == _values("a") + _values("b") + _values("d") + _values("f")
    assert _read_committed(bootstrap, topic, 12) == _values("a") + _values("b") + _values("d")

    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    catalog = iceberg.open_catalog(f"sqlite:///{tmp_path}/catalog.db")
    with caplog.at_level(logging.INFO, logger="automq.spark.lakewrite"):
        first = ingest(spark, location, catalog, [topic], force=True, enabled_topics=False)
    assert [r.status for r in first] == ["committed"], first
    assert "past the last stable offset" in caplog.text
    table = catalog.load_table(first[0].table)
    got = table.scan().to_arrow().sort_by("offset")["value"].to_pylist()
    assert got == _values("a") + _values("b") + _values("d")  # up to the last stable offset
    e_first = next(r.offset for r in rows if bytes(r.value) == b"f0") - 4  # e0..e3 precede f0
    assert first[0].offsets == {0: e_first}
    # the file of f's task (past the last stable offset) was written and deleted again
    on_disk = {str(p) for p in tmp_path.glob("**/*.parquet")}
    assert on_disk == {t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()}

    producer.commit_transaction(60)
    spark_cluster.wait_uploaded(topic, {0: _high_watermark(bootstrap, topic)})
    second = ingest(spark, location, catalog, [topic], force=True, enabled_topics=False)
    assert [r.status for r in second] == ["committed"], second
    table = catalog.load_table(first[0].table)
    everything = _values("a") + _values("b") + _values("d") + _values("e") + _values("f")
    assert sorted(table.scan().to_arrow()["value"].to_pylist()) == sorted(everything)  # exactly once
    assert sorted(_read_committed(bootstrap, topic, 20)) == sorted(everything)
