"""The compaction CronJob the operator renders, run end to end: the real kopf operator on kmock,
a real controller and broker (tests/support/kubelet_harness.py plays the kubelet), the shared
SeaweedFS, and the CronJob's container command and args run as they are (the spark image's
entrypoint, `driver`, spark-submit in client mode, `submit.py compact ...`), with only the
image's file paths and the pods' addresses mapped to this machine (kubelet_jobs.IMAGE_FILES).

Costs one spark-submit JVM of its own (not the suite's shared Spark session): that JVM is what
a CronJob pod starts."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kubelet_harness import KubeletHarness, s3_cluster_spec
from sequenced_load import create_topic

from automq.spark import iceberg
from automq.spark.cluster import ClusterLocation, ClusterView

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.spark, pytest.mark.timeout(600)]


@pytest.fixture
def k8s(tmp_path, s3_url) -> Iterator[KubeletHarness]:
    with KubeletHarness(tmp_path) as harness:
        harness.s3_url = s3_url  # type: ignore[attr-defined]
        yield harness


def _objects(location: ClusterLocation, topic: str) -> set[int]:
    p = ClusterView.load(location, [topic]).topic(topic).partitions[0]
    return {obj.object_id for obj, _, _ in p.ranges()}


def _read_all(bootstrap: str, topic: str, n: int) -> list[tuple[int, bytes | None, bytes | None]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < n and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                out.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


def _run_cron_job(k8s: KubeletHarness, name: str) -> str:
    """Start a run of the CronJob, wait until its Job finished; the run's output."""
    job = k8s.call(k8s.jobs.trigger_cron_job(name))
    done = k8s.wait_for(
        f"Job {job} finished",
        lambda: (
            (j := k8s.get("Job", job))
            and any(
                c["type"] in ("Complete", "Failed") and c["status"] == "True"
                for c in (j.get("status") or {}).get("conditions") or []
            )
            and j
        ),
        timeout=420,
    )
    run = next(r for r in k8s.jobs.runs if r.job == job)
    log = (k8s.root / "logs" / f"{run.pod}.log").read_text(errors="replace")
    assert done["status"].get("succeeded") == 1, log[-3000:]
    # The process ran the CronJob's own args: spark-submit through the entrypoint's driver mode.
    container = k8s.get("CronJob", name)["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert run.args[: run.args.index("--conf")] == container["args"][: container["args"].index("--conf")]
    return log


def test_spark_cron_jobs_run_their_container_command_against_the_cluster(k8s: KubeletHarness, tmp_path) -> None:
    lake = tmp_path / "lake"
    spec = s3_cluster_spec(
        k8s.s3_url,  # type: ignore[attr-defined]
        config={"storage.upload_interval_ms": "100", "storage.upload_block_bytes": "64KiB"},
        compaction={"enabled": True, "minAge": "0s", "cores": 1, "driverMemory": "512m", "keys": {"enabled": False}},
        lakeIngestion={
            "enabled": True,
            "cores": 1,
            "driverMemory": "512m",
            "topics": ["events"],
            "catalogUri": f"sqlite:///{lake}/catalog.db",
            "warehouse": f"file://{lake}/warehouse",
        },
    )
    k8s.create_cluster("demo", spec)
    k8s.wait_ready("demo", brokers=1)
    k8s.wait_for("compaction CronJob", lambda: k8s.get("CronJob", "demo-compact"))
    assert k8s.get("CronJob", "demo-keycompact") is None

    bootstrap = k8s.bootstrap("demo")
    create_topic(bootstrap, "events", 1)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    n = 0
    for r in range(24):  # one small upload each: the broker uploads every 100 ms
        for i in range(40):
            producer.produce("events", key=f"k{i}".encode(), value=bytes([r]) * 500, headers=[("r", str(r).encode())])
            n += 1
        producer.flush(30)
        time.sleep(0.2)
    location = ClusterLocation(
        object_store_url=k8s.s3_url,  # type: ignore[attr-defined]
        controller_urls=tuple(k8s.controller_urls("demo")),
    )
    k8s.wait_for(
        "everything uploaded",
        lambda: ClusterView.load(location, ["events"]).topic("events").partitions[0].end_offset >= n,
        timeout=60,
    )
    before_objects = _objects(location, "events")
    assert len(before_objects) >= 10, f"expected many small objects, got {len(before_objects)}"
    before = _read_all(bootstrap, "events", n)
    assert len(before) == n

    log = _run_cron_job(k8s, "demo-compact")
    assert '"committed": ' in log and '"errors": []' in log, log[-3000:]

    after_objects = _objects(location, "events")
    assert len(before_objects) >= 10 * len(after_objects), (len(before_objects), after_objects)
    assert _read_all(bootstrap, "events", n) == before  # offsets, keys, values: unchanged
    status = k8s.wait_for(
        "last success in the cluster status",
        lambda: (
            ((k8s.get("AutoMQCluster", "demo")["status"].get("sparkJobs") or {}).get("compaction") or {}).get(
                "lastSuccessfulTime"
            )
            and k8s.get("AutoMQCluster", "demo")["status"]["sparkJobs"]["compaction"]
        ),
    )
    assert status["cronJob"] == "demo-compact" and not status.get("lastFailedJob"), status

    # Lake ingestion, the same way: every record once in the Iceberg table, offsets in its snapshot.
    log = _run_cron_job(k8s, "demo-ingest")
    assert '"status": "committed"' in log, log[-3000:]
    table = iceberg.open_catalog(f"sqlite:///{lake}/catalog.db").load_table("kafka.events")
    rows = table.scan().to_arrow().sort_by("offset")
    assert rows["offset"].to_pylist() == [o for o, _, _ in before]
    assert rows["value"].to_pylist() == [v for _, _, v in before]
    assert iceberg.committed_offsets(table) == {0: n}
    k8s.wait_for(
        "ingestion success in the cluster status",
        lambda: ((k8s.get("AutoMQCluster", "demo")["status"].get("sparkJobs") or {}).get("lakeIngestion") or {}).get(
            "lastSuccessfulTime"
        ),
    )
