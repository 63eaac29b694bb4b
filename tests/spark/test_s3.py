"""The jobs on real S3 (SeaweedFS): a cluster whose objects live in a bucket, ingestion and
object compaction in the shared Spark session (credentials from the environment, as in a
CronJob pod), its Python workers reading with ranged GETs through the S3 backend. The same
jobs as processes (`automq spark ...`, spark-submit) on S3 are run by tests/spark/test_cronjob_e2e.py."""

from __future__ import annotations

import time
from urllib.parse import parse_qs

import pytest

from automq.spark.cluster import ClusterLocation, ClusterView
from automq.spark.compact import CompactionSettings, compact
from automq.spark.iceberg import open_catalog
from automq.spark.ingest import ingest

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.s3]


def test_ingest_and_compact_on_seaweedfs(spark, s3_url, sh, tmp_path):
    cluster = sh.start_cluster(tmp_path / "cluster", upload_interval="100ms", object_store_url=s3_url)
    try:
        topic = sh.topic_name("s3")
        sh.create_topic(cluster.bootstrap, topic, partitions=2, configs={"automq.table.topic.enable": "true"})
        n = 0
        for r in range(12):
            recs = [(f"k{i}".encode(), bytes([r]) * 900, [("r", b"%d" % r)], i % 2) for i in range(300)]
            sh.produce_confluent(cluster.bootstrap, topic, recs, **{"compression.type": "snappy"})
            n += len(recs)
            time.sleep(0.2)  # one upload per round (every 0.1 s): many small objects
        cluster.wait_uploaded(topic, n)
        before = sh.consume_all(cluster.bootstrap, topic, n)
        location = ClusterLocation.resolve(data_dir=cluster.data_dir)
        objects_before = {
            o.object_id for p in ClusterView.load(location, [topic]).topic(topic).partitions for o in p.objects
        }

        # the table's data files go to the bucket too: the executors write them there
        bucket, query = s3_url.removeprefix("s3://").split("?", 1)
        endpoint = parse_qs(query)["endpoint"][0]
        warehouse, props = f"s3://{bucket}/lake", {"s3.endpoint": endpoint, "s3.region": "us-east-1"}
        catalog = open_catalog(f"sqlite:///{tmp_path}/lake/catalog.db", warehouse, props)
        [result] = ingest(spark, location, catalog)
        assert (result.topic, result.status, result.records) == (topic, "committed", n)
        table = catalog.load_table(result.table)
        assert all(t.file.file_path.startswith(f"{warehouse}/") for t in table.scan().plan_files())
        rows = table.scan().to_arrow()
        got = sorted(
            zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), rows["value"].to_pylist(), strict=True)
        )
        assert got == [(p, o, v) for p, o, _ts, _k, v, _h in before]

        report = compact(spark, location, CompactionSettings(min_age_ms=0))
        assert report.committed >= 2 and not report.errors, report
        views = ClusterView.load(location, [topic]).topic(topic).partitions
        objects_after = {o.object_id for p in views for o in p.objects}
        assert len(objects_before) >= 8 and len(objects_before) >= 4 * len(objects_after), (
            len(objects_before),
            len(objects_after),
        )
        assert sh.consume_all(cluster.bootstrap, topic, n) == before
    finally:
        sh.stop_cluster(cluster)
