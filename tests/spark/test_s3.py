"""The jobs on real S3 (SeaweedFS): a cluster whose objects live in a bucket, `automq spark
ingest` and `automq spark compact` as processes (credentials from the environment, as in a
CronJob pod), reading with ranged GETs through the S3 backend."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from urllib.parse import parse_qs

import pytest

from automq.spark.cluster import ClusterLocation, ClusterView
from automq.spark.iceberg import open_catalog

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.s3]


def _run(*args: str) -> dict:
    cmd = [sys.executable, "-m", "automq.broker.cli", "spark", *args, "--master", "local[2]"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")][-1]


def test_ingest_and_compact_on_seaweedfs(s3_url, sh, tmp_path):
    cluster = sh.start_cluster(tmp_path / "cluster", object_store_url=s3_url)
    try:
        topic = sh.topic_name("s3")
        sh.create_topic(cluster.bootstrap, topic, partitions=2, configs={"automq.table.topic.enable": "true"})
        n = 0
        for r in range(12):
            recs = [(f"k{i}".encode(), bytes([r]) * 900, [("r", b"%d" % r)], i % 2) for i in range(300)]
            sh.produce_confluent(cluster.bootstrap, topic, recs, **{"compression.type": "snappy"})
            n += len(recs)
            time.sleep(0.7)  # one upload per round (every 0.5 s): many small objects
        cluster.wait_uploaded(topic, n)
        before = sh.consume_all(cluster.bootstrap, topic, n)
        location = ClusterLocation.resolve(data_dir=cluster.data_dir)
        objects_before = {
            o.object_id for p in ClusterView.load(location, [topic]).topic(topic).partitions for o in p.objects
        }

        # the table's data files go to the bucket too: the executors write them there
        catalog = f"sqlite:///{tmp_path}/lake/catalog.db"
        bucket, query = s3_url.removeprefix("s3://").split("?", 1)
        endpoint = parse_qs(query)["endpoint"][0]
        warehouse, props = f"s3://{bucket}/lake", {"s3.endpoint": endpoint, "s3.region": "us-east-1"}
        line = _run(
            "ingest",
            "--data-dir",
            str(cluster.data_dir),
            "--catalog",
            catalog,
            "--warehouse",
            warehouse,
            *[a for k, v in props.items() for a in ("--catalog-property", f"{k}={v}")],
        )
        assert (line["topic"], line["status"], line["records"]) == (topic, "committed", n)
        table = open_catalog(catalog, warehouse, props).load_table(line["table"])
        assert all(t.file.file_path.startswith(f"{warehouse}/") for t in table.scan().plan_files())
        rows = table.scan().to_arrow()
        got = sorted(
            zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), rows["value"].to_pylist(), strict=True)
        )
        assert got == [(p, o, v) for p, o, _ts, _k, v, _h in before]

        report = _run("compact", "--data-dir", str(cluster.data_dir), "--min-age", "0")
        assert report["committed"] >= 2 and not report["errors"], report
        views = ClusterView.load(location, [topic]).topic(topic).partitions
        objects_after = {o.object_id for p in views for o in p.objects}
        assert len(objects_before) >= 8 and len(objects_before) >= 4 * len(objects_after), (
            len(objects_before),
            len(objects_after),
        )
        assert sh.consume_all(cluster.bootstrap, topic, n) == before
    finally:
        sh.stop_cluster(cluster)
